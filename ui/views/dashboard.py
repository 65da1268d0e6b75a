"""The Dashboard's and Training tab's views: one row per version, the rating chart's rows, training curves, the
feedback volume's bins, two versions' eval replies side by side, and what "roll back" promotes."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable, Optional

import pandas as pd

from rlhf.analysis.leaderboard import ELIGIBLE_STATUSES
from rlhf.training.reward_head import wilson_interval
from storage import Job, Policy, RewardModel
from ui.charts import PALETTE
from ui.views.arena import has_interval
from ui.views.text import DASH, fmt, missing, short_time, status_label, version_label

DEFAULT_CURVES = ("reward/mean", "ppo/kl")
VERSION_COLUMNS = ["Version", "Parent", "Created", "Status", "Method", "Feedback used", "RM accuracy", "Gate",
                   "Eval reward", "KL to base", "BT [95% CI]", "Elo", "Votes"]


def rm_accuracy_text(m: dict) -> Optional[str]:
    """Cross-validated reward-model accuracy with its 95% interval; "too few to tell" when it includes chance."""
    acc, low, high = m.get("cv_accuracy"), m.get("cv_low"), m.get("cv_high")
    if missing(acc) or missing(low) or missing(high):
        return None
    if low <= 0.5 <= high:
        return f"too few to tell ({acc:.0%}, {low:.0%}–{high:.0%})"
    return f"{acc:.0%} [{low:.0%}–{high:.0%}]"


def heldout_accuracy_text(acc: Any, pairs: Any) -> str:
    """Accuracy on ``pairs`` held-out pairs (a reward model without cross-validation, e.g. pointwise) with its Wilson
    interval, "too few to tell" when that includes chance: 100% of 2 pairs says nothing. Unknown size: as stored."""
    if missing(acc) or missing(pairs) or int(pairs) <= 0:
        return fmt(acc, 0, percent=True)
    low, high = wilson_interval(float(acc) * int(pairs), int(pairs))
    return rm_accuracy_text({"cv_accuracy": float(acc), "cv_low": low, "cv_high": high})


def method_text(p: Policy) -> str:
    """The retrain method that trained a version, from its own config ("–" for the base and imported versions)."""
    trained = p.data_snapshot and not (p.config or {}).get("imported_from")
    method = ((p.config or {}).get("retrain") or {}).get("method") if trained else None
    return str(method) if method else DASH


def gate_text(m: dict) -> str:
    """The retrain gate's verdict and win-rate interval, e.g. "inconclusive 0.55 [0.40–0.70]: needs arena votes"."""
    verdict = m.get("gate/verdict")
    if not isinstance(verdict, str) or not verdict:
        return DASH
    rate = m.get("gate/win_rate", m.get("eval/win_rate"))  # the held-out judge's (older versions: the RM's)
    if m.get("gate/evidence") == "none":  # no judge measured anything: a win rate here would be a placeholder
        text = f"{verdict}: no judge (too few held-out votes)"
    else:
        text = f"{verdict} {fmt(rate)} [{fmt(m.get('gate/low'))}–{fmt(m.get('gate/high'))}]"
    if m.get("gate/guard_tripped"):
        text += f" · guard: {', '.join(m['gate/guard_tripped'])}"
    if isinstance(m.get("decision/verdict"), str):
        return text + f" · people's votes: {m['decision/verdict']} ({m.get('decision/votes')} votes)"
    return text + (" · needs arena votes" if verdict == "inconclusive" else "")


def mean_eval_reward(samples: list[dict]) -> Optional[float]:
    """The mean reward-model score of a version's stored eval replies (None when none is scored)."""
    scores = [float(s["reward"]) for s in samples if not missing(s.get("reward"))]
    return sum(scores) / len(scores) if scores else None


def versions_table(policies: list[Policy], reward_models: dict[int, RewardModel],
                   table: pd.DataFrame, eval_rewards: Optional[dict[int, float]] = None) -> pd.DataFrame:
    """One row per version, newest first: lineage, status, training metrics and arena ratings. A version without
    an ``eval/reward`` metric (the base) shows the mean score of its stored eval replies (``eval_rewards``)."""
    eval_rewards = eval_rewards or {}
    by_id = {p.id: p for p in policies}
    ratings = {int(r["policy_id"]): r for r in table.to_dict(orient="records")}
    rows = []
    for p in sorted(policies, key=lambda p: p.version, reverse=True):
        m = p.metrics or {}
        rm_metrics = (reward_models[p.reward_model_id].metrics or {}) if p.reward_model_id in reward_models else {}
        cv = rm_accuracy_text({k.split("/", 1)[1]: v for k, v in rm_metrics.items() if k.startswith("reward/")}) or \
            rm_accuracy_text({k: m.get(f"reward_model/{k}") for k in ("cv_accuracy", "cv_low", "cv_high")})
        rm_acc = m.get("reward_model/eval_accuracy")
        if missing(rm_acc):
            rm_acc = rm_metrics.get("eval_accuracy", rm_metrics.get("reward/eval_accuracy"))
        parent = by_id.get(p.parent_id)
        r = ratings.get(p.id, {})
        bt = fmt(r.get("bt"), 0)
        if bt != DASH:
            votes = int(r.get("votes", 0))
            bt += f" [{r['ci_low']:.0f}, {r['ci_high']:.0f}]" if has_interval(r.get("ci_low"), r.get("ci_high")) \
                else (" (no votes)" if not votes else " (no interval yet)")
        used = m.get("feedback_used")
        rows.append({"Version": version_label(p), "Parent": f"v{parent.version}" if parent else DASH,
                     "Created": short_time(p.created), "Status": p.status, "Method": method_text(p),
                     "Feedback used": str(int(used)) if not missing(used) else DASH,
                     "RM accuracy": cv or heldout_accuracy_text(rm_acc, rm_metrics.get("reward/pairs_eval",
                                                                                   rm_metrics.get("pairs_eval"))),
                     "Gate": gate_text(m),
                     "Eval reward": fmt(m.get("eval/reward") if not missing(m.get("eval/reward"))
                                        else eval_rewards.get(p.id), 3),
                     "KL to base": fmt(m.get("eval/kl"), 2), "Elo": fmt(r.get("elo"), 0), "BT [95% CI]": bt,
                     "Votes": int(r.get("votes", 0))})
    return pd.DataFrame(rows, columns=VERSION_COLUMNS)


def rating_rows(table: pd.DataFrame) -> list[dict]:
    """The rating chart's columns (``ui.charts.interval_chart``), oldest version first: BT with its interval when
    there is one, and how many votes it rests on."""
    rows = []
    for i, row in enumerate(table.sort_values("version").itertuples(index=False)):
        votes = int(row.votes)
        interval = has_interval(row.ci_low, row.ci_high)
        note = "no votes" if not votes else f"{votes} vote{'' if votes == 1 else 's'}" + ("" if interval else
                                                                                          ", no interval")
        rows.append({"label": f"v{row.version}", "value": float(row.bt), "note": note,
                     "low": float(row.ci_low) if interval else None, "high": float(row.ci_high) if interval else None,
                     "color": PALETTE[i % len(PALETTE)]})
    return rows


def metric_keys(metric_rows: list[dict]) -> list[str]:
    """Metric keys a job logged, sorted."""
    return sorted({r["key"] for r in metric_rows})


def default_curve_keys(keys: list[str]) -> list[str]:
    """Curves shown first: mean reward and KL when logged, else any reward/KL keys, else the first two."""
    chosen = [k for k in DEFAULT_CURVES if k in keys]
    if not chosen:
        chosen = [k for k in keys if k.startswith("reward/") or "kl" in k.split("/")[-1]][:2]
    return chosen or keys[:2]


def curve_series(metric_rows: list[dict], keys: Iterable[str]) -> dict[str, list[tuple[int, float]]]:
    """Training curves for ``ui.charts.small_multiples``: per chosen key (in the given order), (step, value)."""
    keys = list(keys)
    series: dict[str, list[tuple[int, float]]] = {k: [] for k in keys}
    for r in metric_rows:
        if r["key"] in series and not missing(r["value"]):
            series[r["key"]].append((int(r["step"]), float(r["value"])))
    return {k: sorted(v) for k, v in series.items() if v}


def job_choices(jobs: list[Job]) -> list[tuple[str, int]]:
    """Dropdown choices for the training-curve picker, newest job first."""
    return [(f"#{j.id} {j.kind} · {j.status} · {short_time(j.created)}", j.id)
            for j in sorted(jobs, key=lambda j: j.id, reverse=True)]


BIN_MINUTES = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880, 10080)
MAX_BINS = 36


def _bin_name(minutes: int) -> str:
    if minutes % 1440 == 0:
        return "day" if minutes == 1440 else ("week" if minutes == 10080 else f"{minutes // 1440} days")
    if minutes % 60 == 0:
        return "hour" if minutes == 60 else f"{minutes // 60} hours"
    return "minute" if minutes == 1 else f"{minutes} minutes"


def volume_bins(rows: list[dict], now: datetime) -> tuple[list[str], dict[str, list[int]], str]:
    """Feedback per time bin, from the first feedback to ``now``, for ``ui.charts.bar_chart``: (bin labels,
    counts per kind, caption). The bin width is the smallest of ``BIN_MINUTES`` that gives at most ``MAX_BINS`` bars;
    empty bins are zeros. Rows: ``Store.feedback_volume(per="minute")`` (hour = 'YYYY-MM-DDTHH:MM', kind, n)."""
    if not rows:
        return [], {}, ""
    minute = lambda stamp: int(datetime.strptime(stamp[:16], "%Y-%m-%dT%H:%M").replace(  # noqa: E731
        tzinfo=timezone.utc).timestamp() // 60)
    first = min(minute(r["hour"]) for r in rows)
    last = max(max(minute(r["hour"]) for r in rows), int(now.timestamp() // 60))
    width = next((w for w in BIN_MINUTES if last // w - first // w + 1 <= MAX_BINS), BIN_MINUTES[-1])
    start = max(first // width, last // width - MAX_BINS + 1)
    n = last // width - start + 1
    kinds = [k for k in ("ratings", "comparisons") if any(r["kind"] == k for r in rows)]
    kinds += sorted({r["kind"] for r in rows} - set(kinds))
    stacks = {k: [0] * n for k in kinds}
    for r in rows:
        i = minute(r["hour"]) // width - start
        if 0 <= i < n:
            stacks[r["kind"]][i] += int(r["n"])
    stamps = [datetime.fromtimestamp((start + i) * width * 60, timezone.utc) for i in range(n)]
    same_day = stamps[0].date() == stamps[-1].date()
    fmt_ = "%Y-%m-%d" if width >= 1440 else ("%H:%M" if same_day else "%m-%d %H:%M")
    caption = f"UTC{' ' + stamps[0].strftime('%Y-%m-%d') if same_day and width < 1440 else ''} · one bar per " \
              f"{_bin_name(width)}"
    return [t.strftime(fmt_) for t in stamps], stacks, caption


def prompt_text(prompt: Any) -> str:
    """An eval prompt as text: a string, or the turns of a message list."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict) and "messages" in prompt:
        prompt = prompt["messages"]
    if isinstance(prompt, list):
        turns = [m for m in prompt if isinstance(m, dict) and m.get("role") != "system"]
        if len(turns) == 1:
            return str(turns[0].get("content", ""))
        return "\n".join(f"{m.get('role')}: {m.get('content', '')}" for m in turns)
    return str(prompt)


def side_by_side(samples_a: list[dict], samples_b: list[dict], label_a: str, label_b: str) -> pd.DataFrame:
    """Two versions' replies to the same eval prompts, aligned by prompt, with reward-model scores."""
    if label_a == label_b:
        label_a, label_b = f"{label_a} (A)", f"{label_b} (B)"
    a = {s["prompt_index"]: s for s in samples_a}
    b = {s["prompt_index"]: s for s in samples_b}
    columns = ["Prompt", f"{label_a} reply", f"{label_a} reward", f"{label_b} reply", f"{label_b} reward"]
    rows = []
    for i in sorted(set(a) | set(b)):
        sa, sb = a.get(i), b.get(i)
        rows.append([prompt_text((sa or sb)["prompt"]),
                     sa["reply"] if sa else DASH, fmt(sa["reward"], 3) if sa else DASH,
                     sb["reply"] if sb else DASH, fmt(sb["reward"], 3) if sb else DASH])
    return pd.DataFrame(rows, columns=columns)


def rollback_target(policies: list[Policy]) -> Optional[Policy]:
    """What "roll back" promotes: the active version's parent, else the newest older usable version."""
    active = next((p for p in policies if p.status == "active"), None)
    if active is None:
        return None
    by_id = {p.id: p for p in policies}
    parent = by_id.get(active.parent_id)
    if parent is not None and parent.status != "broken":
        return parent
    older = [p for p in policies if p.version < active.version and p.status != "broken"]
    return max(older, key=lambda p: p.version) if older else None


def version_choices(policies: list[Policy], servable_only: bool = False) -> list[tuple[str, int]]:
    """Dropdown choices (label with status, policy id), newest first."""
    return [(status_label(p), p.id) for p in sorted(policies, key=lambda p: p.version, reverse=True)
            if not servable_only or p.status in ELIGIBLE_STATUSES]
