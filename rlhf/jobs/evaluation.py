"""Evaluate a candidate policy against the active one on held-out prompts, and gate its promotion.

Both versions answer the same prompts greedily (one sample per prompt at temperature 1 made the verdict
mostly noise on a dozen prompts); the new reward model scores both (blind pairwise win rate = share of
prompts where the candidate scores higher, ties half). KL to the base is the Monte-Carlo estimate
E_y~π[log π(y|x) − log π_base(y|x)] on the candidate's own *sampled* replies (the sequence-level KL of
Ziegler et al. 2019), since greedy replies would not be draws from π.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

RewardFn = Callable[[list, list], list]


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


def generate_replies(model, tokenizer, prompts: list[list[dict]], adapter: Optional[str], max_new_tokens: int,
                     temperature: float, seed: int, batch_size: int = 8) -> tuple[list[str], list[list[int]], list]:
    """Replies (text, token ids) and prompt ids for each prompt with one adapter (None = base)."""
    import torch

    texts, reply_ids, prompt_ids = [], [], []
    device = next(model.parameters()).device
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        ids = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True)
               ["input_ids"] for p in chunk]
        batch = tokenizer.pad({"input_ids": ids}, padding_side="left", return_tensors="pt").to(device)
        input_ids, mask, width, pad = batch["input_ids"], batch["attention_mask"], batch["input_ids"].shape[1], \
            tokenizer.pad_token_id
        torch.manual_seed(seed + start)
        kwargs = dict(do_sample=True, temperature=temperature, top_p=1.0) if temperature > 0 else \
            dict(do_sample=False, temperature=None, top_p=None, top_k=None)
        with _adapter_ctx(model, adapter), torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                 pad_token_id=pad, **kwargs)
        for row, p_ids in zip(out[:, width:].tolist(), ids):
            eos = {tokenizer.eos_token_id, pad}
            cut = next((k for k, t in enumerate(row) if t in eos), len(row))
            reply_ids.append(row[:cut])
            prompt_ids.append(list(p_ids))
            texts.append(tokenizer.decode(row[:cut], skip_special_tokens=True))
    return texts, reply_ids, prompt_ids


def sequence_logprobs(model, prompt_ids: list[list[int]], reply_ids: list[list[int]],
                      adapter: Optional[str]) -> list[float]:
    """Sum of log π(reply token | prefix) per reply, under one adapter (None = base)."""
    import torch

    out = []
    device = next(model.parameters()).device
    for p, r in zip(prompt_ids, reply_ids):
        if not r:
            out.append(0.0)
            continue
        ids = torch.tensor([p + r], device=device)
        with _adapter_ctx(model, adapter), torch.inference_mode():
            logits = model(input_ids=ids).logits[0, len(p) - 1:-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r, device=device)[:, None]).sum()
        out.append(float(logp))
    return out


def evaluate_versions(model, tokenizer, prompts: list[list[dict]], scorer: RewardFn, candidate: str,
                      active: Optional[str], max_new_tokens: int = 48, temperature: float = 1.0,
                      seed: int = 1234) -> EvalReport:
    """Candidate (adapter name) vs active (adapter name or None = base) on held-out prompts."""
    cand_text, _, _ = generate_replies(model, tokenizer, prompts, candidate, max_new_tokens, 0.0, seed)
    act_text, _, _ = generate_replies(model, tokenizer, prompts, active, max_new_tokens, 0.0, seed)
    cand_r = [float(x) for x in scorer(prompts, cand_text)]
    act_r = [float(x) for x in scorer(prompts, act_text)]
    members = getattr(scorer, "member_scores", None)  # an ensemble: the gate also resamples its members
    cand_m = np.asarray(members(prompts, cand_text)) if members else np.asarray(cand_r)[:, None]
    act_m = np.asarray(members(prompts, act_text)) if members else np.asarray(act_r)[:, None]
    # KL to base on the candidate's sampled replies (at the rollout temperature)
    _, sampled_ids, p_ids = generate_replies(model, tokenizer, prompts, candidate, max_new_tokens,
                                             temperature or 1.0, seed)
    lp_c = sequence_logprobs(model, p_ids, sampled_ids, candidate)
    lp_b = sequence_logprobs(model, p_ids, sampled_ids, None)
    kl = sum(c - b for c, b in zip(lp_c, lp_b)) / max(1, len(prompts))
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    return EvalReport(
        candidate_reward=mean(cand_r), active_reward=mean(act_r), win_rate=win_rate(cand_r, act_r), kl_to_base=kl,
        samples=[{"prompt_index": i, "prompt": p, "reply": t, "reward": r}
                 for i, (p, t, r) in enumerate(zip(prompts, cand_text, cand_r))],
        active_samples=[{"prompt_index": i, "prompt": p, "reply": t, "reward": r}
                        for i, (p, t, r) in enumerate(zip(prompts, act_text, act_r))],
        candidate_members=cand_m, active_members=act_m)
