"""People's votes inside PPO (``ppo.vote_weight``): DPO's loss on the decided pairs the reward model learned from,
one small batch of them after each PPO update.

PPO learns only from what the policy samples. Where the base seldom says what people preferred (a polite phrase in
one reply of thirteen), its rollouts seldom carry it, and the reward model's score has little to act on. The voted
pairs hold such replies. This term pulls the policy toward each pair's chosen reply and away from its rejected one,
relative to the reference (the base: the adapter off, as for PPO's KL), while the rollouts and PPO's voice terms
still decide what it samples. The reference's log-probs of every pair are read once, at the start of the run.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from rlhf.prompting import encode_prompt
from rlhf.training.ppo.core import logprobs_from_logits, preference_loss
from rlhf.training.ppo.rollout import Rollout

REPLY_TOKENS = 192  # longest voted reply read, in tokens: a longer one is cut (and its end of turn not read)


class VoteTerm:
    """The decided pairs (``{prompt: messages, chosen, rejected}``) as token rows, their reference log-probs, and
    the DPO loss of the policy on the batch of them that a step takes (``ppo.vote_batch`` pairs per process,
    an epoch's order drawn from ``ppo.seed``, so a resumed run reads the pairs the original would have)."""

    def __init__(self, tokenizer, pairs: Sequence[dict], cfg, device):
        if not pairs:
            raise ValueError("ppo.vote_weight needs at least one decided pair")
        self.tokenizer, self.cfg, self.device = tokenizer, cfg, device
        self.prompt_ids = [encode_prompt(tokenizer, list(p["prompt"]), cfg.max_prompt_tokens) for p in pairs]
        self.replies = [(p["chosen"], p["rejected"]) for p in pairs]
        stop = tokenizer.eos_token_id  # each reply ends in the end-of-turn token, as generation ends it
        self.tokens = [tuple((tokenizer(t, add_special_tokens=False)["input_ids"] + [stop])[:REPLY_TOKENS]
                             for t in pair) for pair in self.replies]
        self.reference: torch.Tensor | None = None  # (pairs, 2): summed log-probs of chosen, rejected

    def __len__(self) -> int:
        return len(self.replies)

    def rows(self, idx: Sequence[int]) -> Rollout:
        """The chosen replies of pairs ``idx`` after their prompts, then their rejected replies: prompts
        left-padded, replies right-padded, each reply ending in the end-of-turn token as generation ends it."""
        pad = self.tokenizer.pad_token_id
        texts = [self.replies[i][0] for i in idx] + [self.replies[i][1] for i in idx]
        tokens = [self.tokens[i][0] for i in idx] + [self.tokens[i][1] for i in idx]
        width = max(len(t) for t in tokens)
        response = torch.tensor([t + [pad] * (width - len(t)) for t in tokens])
        mask = torch.tensor([[1.0] * len(t) + [0.0] * (width - len(t)) for t in tokens])
        enc = self.tokenizer.pad({"input_ids": [self.prompt_ids[i] for i in idx] * 2}, padding=True,
                                 return_tensors="pt", padding_side="left")
        ids = torch.cat([enc["input_ids"], response], 1).to(self.device)
        attention = torch.cat([enc["attention_mask"], mask.long()], 1).to(self.device)
        return Rollout(ids, attention, response.to(self.device), mask.to(self.device), texts, [True] * len(texts))

    def _logprobs(self, model, rows: Rollout) -> torch.Tensor:
        """Each row's summed log-prob of its reply (temperature 1: the votes are about the replies as written)."""
        logits, _ = model(rows.input_ids, rows.attention_mask, rows.response_len, 1.0, with_values=False)
        return (logprobs_from_logits(logits, rows.response) * rows.mask).sum(1)

    @torch.no_grad()
    def prepare(self, policy) -> None:
        """Read every pair's reference log-probs (``policy``: the unwrapped PolicyWithValue, its adapter off)."""
        chunk = max(1, self.cfg.vote_batch)
        parts = []
        with policy.policy.disable_adapter():
            for start in range(0, len(self), chunk):
                idx = list(range(start, min(start + chunk, len(self))))
                lp = self._logprobs(policy, self.rows(idx))
                parts.append(torch.stack([lp[:len(idx)], lp[len(idx):]], 1))
        self.reference = torch.cat(parts)

    def per_step(self, world: int = 1) -> int:
        """Pairs a step reads on each process: ``ppo.vote_batch``, raised up to ``ppo.vote_batch_max`` when the
        ``ppo.vote_passes`` passes over every pair would not fit in ``ppo.steps`` (a larger pool: every pair
        read as often as a smaller pool's), never more than the pairs there are."""
        k = self.cfg.vote_batch
        if self.cfg.vote_passes > 0:
            needed = math.ceil(self.cfg.vote_passes * len(self) / (self.cfg.steps * world))
            k = max(k, min(needed, self.cfg.vote_batch_max))
        return min(k, len(self))

    def batch(self, step: int, rank: int = 0, world: int = 1) -> list[int]:
        """The pairs step ``step`` (from 1) reads on process ``rank``: consecutive places in a shuffled order
        of all pairs, a fresh order per pass."""
        n, k = len(self), self.per_step(world)
        start = ((step - 1) * world + rank) * k
        out = []
        for place in range(start, start + k):
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.cfg.seed * 7907 + place // n))
            out.append(int(order[place % n]))
        return out

    def active(self, step: int, world: int = 1) -> bool:
        """Whether step ``step`` takes a vote batch: always, or (``ppo.vote_passes``) until the steps before it
        have read every pair that many times."""
        done = (step - 1) * world * self.per_step(world)
        return self.cfg.vote_passes == 0 or done < self.cfg.vote_passes * len(self)

    def loss(self, model, step: int, rank: int = 0, world: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, margins) of the policy (``model``, as the update calls it) on this step's pairs: DPO's loss,
        plus ``ppo.vote_nll_weight`` x the chosen replies' mean negative log-likelihood per token."""
        if self.reference is None:
            raise RuntimeError("VoteTerm.prepare must read the reference before the first loss")
        idx = self.batch(step, rank, world)
        rows = self.rows(idx)
        lp, n = self._logprobs(model, rows), len(idx)  # the first n rows are the chosen replies
        ref = self.reference[idx].to(lp.device)
        loss, margins = preference_loss(lp[:n], lp[n:], ref[:, 0], ref[:, 1], self.cfg.vote_beta,
                                        self.cfg.vote_smoothing)
        if self.cfg.vote_nll_weight > 0:
            loss = loss + self.cfg.vote_nll_weight * chosen_nll(lp[:n], rows.mask[:n])
        return loss, margins


def chosen_nll(summed_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """RPO's likelihood term: the mean over replies of minus each reply's log-prob per token."""
    return -(summed_logprobs / mask.sum(1).clamp(min=1)).mean()
