"""The retrain's data step: one snapshot of the agent's feedback, from which the reward model's pairs are built
(``rlhf.training.reward.prepare_data``), and the dry run that says whether a retrain would pass that step now and
what it would cost."""
from __future__ import annotations

from typing import Optional

from rlhf.config import AppConfig, ConfigError, job_overrides
from rlhf.retrain.progress import estimate_minutes, measured_rates
from storage import InvalidInput, Store


def take_snapshot(store: Store, agent_id: int):
    """The job's one read of the feedback (``rlhf.training.data.FeedbackSnapshot``): every later step trains and
    counts on these rows, nothing newer."""
    from rlhf.training.data import FeedbackSnapshot

    return FeedbackSnapshot.take(store, agent_id)


def dry_run(store: Store, config: AppConfig, agent: str, overrides: Optional[dict] = None) -> dict:
    """What a retrain would use and cost now: feedback counts, pairs, minutes, and what is missing.

    Readiness is the retrain's own data preparation (``rlhf.training.reward.prepare_data``) on a snapshot of the
    feedback: the dry run says ready exactly when a retrain's data phase would pass, and otherwise repeats its
    NotEnoughData."""
    from rlhf.training.data import FeedbackSnapshot, NotEnoughData
    from rlhf.training.reward import prepare_data, reward_rows

    try:
        cfg = job_overrides(config, overrides or {})
    except ConfigError as exc:
        raise InvalidInput(f"config: {exc}") from None
    snapshot = FeedbackSnapshot.take(store, agent)
    missing = None
    try:
        counts = prepare_data(snapshot.rows, cfg.reward, cfg.gate.judge_share, cfg.gate.min_judge_pairs).counts
        n_pairs, n_points = counts["pairs"], counts["points"]
    except NotEnoughData as exc:
        pairs, points = reward_rows(snapshot.rows, cfg.reward)
        n_pairs, n_points, missing = len(pairs), len(points), exc.missing
    out = {"feedback_count": snapshot.feedback_count, "pairs": n_pairs, "pointwise": n_points,
           "estimated_minutes": estimate_minutes(measured_rates(store, agent), n_pairs, cfg), "ready": missing is None}
    if missing is not None:
        out["missing"] = missing
    return out
