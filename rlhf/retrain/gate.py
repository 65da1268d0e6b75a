"""The promotion gate: a verdict from evidence PPO did not optimise, blocked by the reward-hacking guard.

Order of the rules (``decide``), each a reason a team lead can read in the job result:

1. KL to base above ``retrain.max_kl``: reject.
2. No held-out judge (too few pairs, pointwise feedback, ``gate.judge_share`` 0): inconclusive — people decide.
3. The judge's accuracy on votes it never saw cannot be told from chance (95% Wilson interval includes 0.5):
   inconclusive. Its win rate would be a coin flip dressed as a number.
4. The judge's win rate of candidate over active (replies to the held-out prompts at ``eval.reply_temperature``,
   bootstrap over prompts and judge members): promote when the lower bound is above ``retrain.min_win_rate``,
   reject when the upper bound is below 0.5, otherwise inconclusive.
5. A promote stands only when the reward model PPO followed can itself be told from chance (its cross-validated
   interval excludes 0.5) and the guard (``rlhf.retrain.guard``) did not trip; otherwise inconclusive.

An inconclusive candidate is published as a candidate and paired with the active version in the arena and the
vote queue until people's votes decide (``rlhf.analysis.confidence_sequence``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from rlhf.retrain.evaluation import GateVerdict, gate as win_rate_rule


@dataclass(frozen=True)
class Evidence:
    """How far the gate can trust its judge and the reward model PPO followed (accuracies with 95% intervals)."""

    judge_accuracy: Optional[float] = None
    judge_low: Optional[float] = None
    judge_high: Optional[float] = None
    judge_pairs: int = 0
    judge_test_pairs: int = 0
    rm_cv_accuracy: Optional[float] = None
    rm_cv_low: Optional[float] = None
    rm_cv_high: Optional[float] = None

    @classmethod
    def from_metrics(cls, metrics: dict, prefix: str = "reward/") -> "Evidence":
        """From a reward model's metrics (``reward/cv_*`` and ``reward/judge_*``)."""
        get = lambda k: metrics.get(prefix + k)  # noqa: E731
        return cls(get("judge_accuracy"), get("judge_low"), get("judge_high"), int(get("judge_pairs") or 0),
                   int(get("judge_test_pairs") or 0), get("cv_accuracy"), get("cv_low"), get("cv_high"))

    @property
    def has_judge(self) -> bool:
        return self.judge_pairs > 0 and self.judge_low is not None

    @property
    def judge_beats_chance(self) -> bool:
        return self.has_judge and self.judge_low > 0.5

    @property
    def rm_beats_chance(self) -> bool:
        return self.rm_cv_low is not None and self.rm_cv_low > 0.5


@dataclass(frozen=True)
class GateResult:
    """The verdict plus what it rests on (``evidence``) and what the guard found (``guard``)."""

    verdict: GateVerdict
    evidence: dict = field(default_factory=dict)
    guard: dict = field(default_factory=dict)

    @property
    def guarded(self) -> bool:
        return bool(self.guard.get("tripped"))

    def to_dict(self) -> dict:
        """The job result's ``gate``: verdict, win rate and interval, reason, evidence and guard."""
        return {**self.verdict.to_dict(), "evidence": self.evidence,
                "guard": self.guard or {"tripped": [], "examples": []}}

    def metrics(self) -> dict:
        """The version's ``gate/*`` metrics (dashboard, arena pairing, decisions)."""
        return {"gate/verdict": self.verdict.verdict, "gate/win_rate": self.verdict.win_rate,
                "gate/low": self.verdict.low, "gate/high": self.verdict.high, "gate/reason": self.verdict.reason,
                "gate/evidence": self.evidence.get("source"), "gate/guarded": self.guarded,
                "gate/guard_tripped": list(self.guard.get("tripped", [])),
                "gate/judged": "verdict_from_judge" in self.evidence}  # else win rate and interval are placeholders


def _fmt(x: Optional[float]) -> str:
    return "–" if x is None else f"{x:.2f}"


def _inconclusive(rate: float, low: float, high: float, why: str) -> GateVerdict:
    return GateVerdict("inconclusive", rate, low, high, f"{why}; published as a candidate that needs arena votes")


def decide(judge_candidate: Optional[np.ndarray], judge_active: Optional[np.ndarray], evidence: Evidence,
           kl_to_base: float, min_win_rate: float, max_kl: float, guard: Optional[dict] = None,
           rm_candidate: Optional[np.ndarray] = None, rm_active: Optional[np.ndarray] = None,
           seed: int = 0) -> GateResult:
    """The gate's verdict from the judge's (prompts, members) scores of candidate and active replies.

    ``rm_*``: the same replies under PPO's own reward model, reported beside the verdict (never used for it).
    """
    guard = guard or {"tripped": [], "examples": []}
    ev = {"source": "judge" if evidence.has_judge else "none", "kl_to_base": kl_to_base,
          "judge": {"accuracy": evidence.judge_accuracy, "low": evidence.judge_low, "high": evidence.judge_high,
                    "pairs": evidence.judge_pairs, "test_pairs": evidence.judge_test_pairs},
          "reward_model": {"cv_accuracy": evidence.rm_cv_accuracy, "cv_low": evidence.rm_cv_low,
                           "cv_high": evidence.rm_cv_high}}
    if rm_candidate is not None and rm_active is not None:
        own = win_rate_rule(rm_candidate, rm_active, 0.0, min_win_rate, float("inf"), seed=seed)
        ev["reward_model"].update(win_rate=own.win_rate, low=own.low, high=own.high)
    if kl_to_base > max_kl:
        return GateResult(GateVerdict("reject", 0.0, 0.0, 1.0, f"KL to base {kl_to_base:.2f} is above the limit "
                                                              f"{max_kl:.2f}"), ev, guard)
    if not evidence.has_judge or judge_candidate is None or judge_active is None:
        return GateResult(_inconclusive(0.5, 0.0, 1.0, "no held-out judge (too few preference pairs to keep some "
                                                       "out of PPO's reward model)"), ev, guard)
    raw = win_rate_rule(judge_candidate, judge_active, kl_to_base, min_win_rate, max_kl, seed=seed)
    ev["verdict_from_judge"] = raw.verdict
    judge_text = (f"the judge's accuracy on {evidence.judge_test_pairs} votes it never saw is "
                  f"{_fmt(evidence.judge_accuracy)} (95% interval {_fmt(evidence.judge_low)}–"
                  f"{_fmt(evidence.judge_high)})")
    if not evidence.judge_beats_chance:
        return GateResult(_inconclusive(raw.win_rate, raw.low, raw.high, f"{judge_text}: it cannot be told from "
                                                                         "chance"), ev, guard)
    verdict = GateVerdict(raw.verdict, raw.win_rate, raw.low, raw.high, f"judge {raw.reason}")
    if raw.verdict == "promote" and not evidence.rm_beats_chance:
        verdict = _inconclusive(raw.win_rate, raw.low, raw.high, "the reward model PPO followed cannot be told from "
                                f"chance (cross-validated {_fmt(evidence.rm_cv_accuracy)}, 95% interval "
                                f"{_fmt(evidence.rm_cv_low)}–{_fmt(evidence.rm_cv_high)})")
    elif raw.verdict == "promote" and guard.get("tripped"):
        verdict = _inconclusive(raw.win_rate, raw.low, raw.high, "the judge prefers it, but the reward-hacking guard "
                                f"tripped ({', '.join(guard['tripped'])})")
    return GateResult(verdict, ev, guard)


def judge_scores(judge, prompts: list, candidate_texts: list[str], active_texts: list[str]):
    """(candidate, active) (prompts, members) scores under the judge; (None, None) without one."""
    if judge is None:
        return None, None
    both = np.asarray(judge.member_scores(prompts + prompts, list(candidate_texts) + list(active_texts)), float)
    return both[:len(prompts)], both[len(prompts):]
