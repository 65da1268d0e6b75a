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

    def metrics(self) -> dict:
        return {"eval/reward": self.candidate_reward, "eval/active_reward": self.active_reward,
                "eval/win_rate": self.win_rate, "eval/kl": self.kl_to_base}


def win_rate(candidate: Sequence[float], active: Sequence[float]) -> float:
    """Share of prompts where the candidate's reward beats the active one's (ties count half)."""
    if not candidate:
        return 0.0
    return sum(1.0 if c > a else 0.5 if c == a else 0.0 for c, a in zip(candidate, active)) / len(candidate)


def gate(report: EvalReport, min_win_rate: float, max_kl: float) -> tuple[bool, list[str]]:
    """Whether a candidate may be promoted, and why not."""
    reasons = []
    if report.win_rate < min_win_rate:
        reasons.append(f"win rate {report.win_rate:.2f} vs active is below {min_win_rate:.2f}")
    if report.candidate_reward < report.active_reward:
        reasons.append(f"mean reward {report.candidate_reward:.3f} is below the active version's "
                       f"{report.active_reward:.3f}")
    if report.kl_to_base > max_kl:
        reasons.append(f"KL to base {report.kl_to_base:.2f} is above the limit {max_kl:.2f}")
    return not reasons, reasons


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
        width = max(len(i) for i in ids)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(i)) + list(i) for i in ids], device=device)
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids], device=device)
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
                        for i, (p, t, r) in enumerate(zip(prompts, act_text, act_r))])
