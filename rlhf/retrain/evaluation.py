"""Evaluate a candidate policy against the active one on held-out prompts, and gate its promotion.

Both versions answer the same prompts greedily (one sample per prompt at temperature 1 made the verdict
mostly noise on a dozen prompts); the new reward model scores both (blind pairwise win rate = share of
prompts where the candidate scores higher, ties half). KL to the base is the Monte-Carlo estimate
E_y~π[log π(y|x) − log π_base(y|x)] on the candidate's own *sampled* replies (the sequence-level KL of
Ziegler et al. 2019), since greedy replies would not be draws from π; the retrain takes it from PPO's final
evaluation, which measures exactly that on the same prompts.

Replies are generated through the serving seam (``rlhf.serving.interface``) by its torch engine: every version's
reply to every prompt in one continuous batch, the reply each row would get alone.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from rlhf.prompting import encode_prompt
from rlhf.training.shaping import RewardFn


@dataclass
class EvalReport:
    """What the gate and the dashboard need about a candidate vs the active version."""

    candidate_reward: float
    active_reward: float
    win_rate: float
    kl_to_base: float
    samples: list = field(default_factory=list)  # candidate: {prompt_index, prompt, reply, reward}
    active_samples: list = field(default_factory=list)
    candidate_members: Optional[np.ndarray] = None  # (prompts, members) scores under each ensemble member
    active_members: Optional[np.ndarray] = None

    def metrics(self) -> dict:
        return {"eval/reward": self.candidate_reward, "eval/active_reward": self.active_reward,
                "eval/win_rate": self.win_rate, "eval/kl": self.kl_to_base}


def win_rate(candidate: Sequence[float], active: Sequence[float]) -> float:
    """Share of prompts where the candidate's reward beats the active one's (ties count half)."""
    if not candidate:
        return 0.0
    return sum(1.0 if c > a else 0.5 if c == a else 0.0 for c, a in zip(candidate, active)) / len(candidate)


@dataclass(frozen=True)
class GateVerdict:
    """The gate's answer: promote, reject, or inconclusive (published as a candidate that needs arena votes)."""

    verdict: str
    win_rate: float
    low: float
    high: float
    reason: str

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "win_rate": self.win_rate, "low": self.low, "high": self.high,
                "reason": self.reason}


def win_matrix(candidate: np.ndarray, active: np.ndarray) -> np.ndarray:
    """(prompts, members) 1 where the candidate's reply scores higher under that member, 0.5 on a tie."""
    c, a = np.asarray(candidate, float), np.asarray(active, float)
    c, a = (c[:, None], a[:, None]) if c.ndim == 1 else (c, a)
    return np.where(c > a, 1.0, np.where(c == a, 0.5, 0.0))


def bootstrap_interval(wins: np.ndarray, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the win rate, resampling prompts and (per draw) one ensemble member."""
    if wins.size == 0:
        return 0.0, 1.0
    rng = np.random.default_rng(seed)
    n, m = wins.shape
    rows = rng.integers(0, n, (n_boot, n))
    cols = rng.integers(0, m, n_boot)
    rates = wins[rows, cols[:, None]].mean(axis=1)
    return float(np.percentile(rates, 2.5)), float(np.percentile(rates, 97.5))


def gate(candidate: np.ndarray, active: np.ndarray, kl_to_base: float, min_win_rate: float, max_kl: float,
         seed: int = 0) -> GateVerdict:
    """Promote when the win rate's lower bound is above ``min_win_rate``; reject when its upper bound is below
    0.5 (or the KL is over the limit); otherwise inconclusive: let the arena's votes decide."""
    wins = win_matrix(candidate, active)
    rate = float(wins.mean()) if wins.size else 0.0
    low, high = bootstrap_interval(wins, seed=seed)
    shown = f"win rate {rate:.2f} (95% interval {low:.2f}–{high:.2f}, {wins.shape[0]} prompts)"
    if kl_to_base > max_kl:
        return GateVerdict("reject", rate, low, high, f"KL to base {kl_to_base:.2f} is above the limit {max_kl:.2f}")
    if low > min_win_rate:
        return GateVerdict("promote", rate, low, high, f"{shown}: lower bound above {min_win_rate:.2f}")
    if high < 0.5:
        return GateVerdict("reject", rate, low, high, f"{shown}: upper bound below 0.5")
    return GateVerdict("inconclusive", rate, low, high,
                       f"{shown}: too close to call; published as a candidate that needs arena votes")


def _adapter_ctx(model, name: Optional[str]):
    if name is None:
        return model.disable_adapter() if hasattr(model, "disable_adapter") else contextlib.nullcontext()
    model.set_adapter(name)
    return contextlib.nullcontext()


@dataclass
class Replies:
    """One adapter's replies to every prompt: text, generated token ids (EOS not included) and prompt ids."""

    texts: list
    token_ids: list
    prompt_ids: list


def generate_replies(model, tokenizer, prompts: list[list[dict]], adapters: Sequence[Optional[str]],
                     max_new_tokens: int, temperature: float, seed: int, max_batch_size: int = 64,
                     max_prompt_tokens: Optional[int] = None,
                     on_reply: Optional[Callable[[int, int], None]] = None) -> list[Replies]:
    """Every adapter's (None = base) reply to every prompt, all decoded together by the serving engine.

    Prompts are fitted to ``max_prompt_tokens`` by ``rlhf.prompting.encode_prompt`` (the rule PPO's rollouts use).
    ``on_reply(done, total)`` hears each finished reply, for a progress bar.

    One continuous batch instead of one ``generate`` per adapter and chunk: rows of different adapters share
    each forward pass (peft mixed-adapter batches) and leave as they finish. Greedy at temperature 0; otherwise
    temperature -> top-k 50 -> top-p 1 sampling (HF ``generate``'s filters) with one generator per reply seeded
    ``seed + prompt index``, so a reply does not depend on what else shares the batch.
    """
    from rlhf.serving.interface import Request
    from rlhf.serving.policy_server import GenParams, ReplyStream, local_engine

    ids = [encode_prompt(tokenizer, p, max_prompt_tokens) for p in prompts]
    rows = [(a, i) for a in adapters for i in range(len(ids))]
    if not rows:
        return [Replies([], [], []) for _ in adapters]
    device = str(next(model.parameters()).device)
    # The torch engine of the serving seam: the adapters live on this job's peft model (training stays in torch).
    engine = local_engine(model, tokenizer, device, max_batch_size=max_batch_size, queue_size=len(rows),
                          batch_window_ms=0, max_prefill_tokens=max(1024, sum(map(len, ids))), start=False)
    streams = [ReplyStream(prompt_tokens=len(ids[i])) for _ in adapters for i in range(len(ids))]
    for (adapter, i), stream in zip(rows, streams):
        params = GenParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0, seed=seed + i)
        engine.submit(Request(ids[i], adapter, params, stream))
    engine.start()  # everything is queued: the first prefill takes all of it (up to max_batch_size)
    try:
        for done, stream in enumerate(streams, 1):
            stream.text()  # wait for the end (the stream's text holds back a last incomplete character)
            if on_reply is not None:
                on_reply(done, len(streams))
    finally:
        engine.close()
    texts = [tokenizer.decode(stream.token_ids, skip_special_tokens=True) for stream in streams]
    n = len(ids)
    return [Replies(texts[k * n:(k + 1) * n], [streams[k * n + i].token_ids for i in range(n)], ids)
            for k in range(len(adapters))]


def sequence_logprobs(model, prompt_ids: list[list[int]], reply_ids: list[list[int]],
                      adapter: Optional[str], batch_size: int = 4) -> list[float]:
    """Sum of log π(reply token | prefix) per reply, under one adapter (None = base), a few rows per forward."""
    import torch

    out = []
    device = next(model.parameters()).device
    for start in range(0, len(prompt_ids), batch_size):
        chunk = list(zip(prompt_ids[start:start + batch_size], reply_ids[start:start + batch_size]))
        width = max(len(p) + len(r) for p, r in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, (p, r) in enumerate(chunk):  # right padding: positions are those of each sequence alone
            ids[row, :len(p) + len(r)] = torch.tensor(list(p) + list(r))
            mask[row, :len(p) + len(r)] = 1
        with _adapter_ctx(model, adapter), torch.inference_mode():
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        for row, (p, r) in enumerate(chunk):
            if not r:
                out.append(0.0)
                continue
            logp = torch.log_softmax(logits[row, len(p) - 1:len(p) + len(r) - 1].float(), -1)
            out.append(float(logp.gather(-1, torch.tensor(r, device=logp.device)[:, None]).sum()))
    return out


def evaluate_versions(model, tokenizer, prompts: list[list[dict]], scorer: RewardFn, candidate: str,
                      active: Optional[str], max_new_tokens: int = 48, temperature: float = 1.0,
                      seed: int = 1234, kl_to_base: Optional[float] = None,
                      max_prompt_tokens: Optional[int] = None,
                      on_reply: Optional[Callable[[int, int], None]] = None) -> EvalReport:
    """Candidate (adapter name) vs active (adapter name or None = base) on held-out prompts.

    ``kl_to_base``: the candidate's KL already measured on these prompts (PPO's final evaluation samples the
    candidate and scores it against the base: the same estimate); when None or NaN it is measured here.
    ``on_reply(done, total)``: progress of the compared replies.
    """
    import math

    cand, act = generate_replies(model, tokenizer, prompts, [candidate, active], max_new_tokens, 0.0, seed,
                                 max_prompt_tokens=max_prompt_tokens, on_reply=on_reply)
    cand_text, act_text = cand.texts, act.texts
    members = getattr(scorer, "member_scores", None)  # an ensemble: the gate also resamples its members
    if members:  # the reward is the members' mean: one feature pass scores both versions
        both = np.asarray(members(prompts + prompts, cand_text + act_text), dtype=float)
        cand_m, act_m = both[:len(prompts)], both[len(prompts):]
        cand_r, act_r = cand_m.mean(axis=1).tolist(), act_m.mean(axis=1).tolist()
    else:
        scores = [float(x) for x in scorer(prompts + prompts, cand_text + act_text)]
        cand_r, act_r = scores[:len(prompts)], scores[len(prompts):]
        cand_m, act_m = np.asarray(cand_r)[:, None], np.asarray(act_r)[:, None]
    if kl_to_base is None or not math.isfinite(kl_to_base):
        # KL to base on the candidate's sampled replies (at the rollout temperature)
        (sampled,) = generate_replies(model, tokenizer, prompts, [candidate], max_new_tokens, temperature or 1.0,
                                      seed, max_prompt_tokens=max_prompt_tokens)
        lp_c = sequence_logprobs(model, sampled.prompt_ids, sampled.token_ids, candidate)
        lp_b = sequence_logprobs(model, sampled.prompt_ids, sampled.token_ids, None)
        kl_to_base = sum(c - b for c, b in zip(lp_c, lp_b)) / max(1, len(prompts))
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    return EvalReport(
        candidate_reward=mean(cand_r), active_reward=mean(act_r), win_rate=win_rate(cand_r, act_r),
        kl_to_base=float(kl_to_base),
        samples=[{"prompt_index": i, "prompt": p, "reply": t, "reward": r}
                 for i, (p, t, r) in enumerate(zip(prompts, cand_text, cand_r))],
        active_samples=[{"prompt_index": i, "prompt": p, "reply": t, "reward": r}
                        for i, (p, t, r) in enumerate(zip(prompts, act_text, act_r))],
        candidate_members=cand_m, active_members=act_m)
