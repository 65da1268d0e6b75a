"""View models of the arena and the dashboard: Store records in, tables, plot frames and labels out.

Pure functions (no Gradio, no Store): the tabs and the REST router call them with what they read,
and the tests call them with hand-made records.
"""
from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from typing import Any, Iterable, Optional

import pandas as pd

from rlhf.analysis.leaderboard import ELIGIBLE_STATUSES, leaderboard, win_rate_matrix
from storage import Comparison, Job, Policy, RewardModel

DASH = "–"
BOOTSTRAP_ROUNDS = 200
DEFAULT_CURVES = ("reward/mean", "ppo/kl")


# ---- formatting ------------------------------------------------------------------------------------
def missing(value: Any) -> bool:
    """True for None, NaN and non-numbers that the tables show as a dash."""
    if value is None or isinstance(value, bool):
        return True
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return True


def fmt(value: Any, digits: int = 2, percent: bool = False) -> str:
    """A number for a table cell; a dash when it is missing."""
    if missing(value):
        return DASH
    value = float(value)
    return f"{value * 100:.{digits}f}%" if percent else f"{value:.{digits}f}"


def version_label(policy: Policy) -> str:
    """Short name of a version: ``v3``, or ``v0 · base`` for the base model."""
    return f"v{policy.version}" + (" · base" if policy.is_base else "")


def status_label(policy: Policy) -> str:
    """Version name with its status, for dropdowns and reveals."""
    return f"{version_label(policy)} ({policy.status})"


def short_time(stamp: Optional[str]) -> str:
    """ISO UTC timestamp as ``YYYY-MM-DD HH:MM``."""
    return stamp[:16].replace("T", " ") if stamp else DASH


# The Chatbot renders Markdown and (sanitized) HTML: a reply that writes <b> or <script> would lose those
# characters on screen, and the rater would judge something else than what was said. Markdown cannot be
# trusted to say where code starts (a fence needs a line start, a span matching backtick runs, an
# indented block four spaces), and inside code an escape shows as "&lt;" while outside it raw HTML
# renders. So nothing is left to Markdown: every character that opens raw HTML, an entity, code
# (backtick, tilde, deep indentation), a link or image ([) or a backslash escape becomes an entity, the
# same way everywhere. Emphasis, lists, headings and block quotes (> stays) still format the text.
_INERT = str.maketrans({"&": "&amp;", "<": "&lt;", "`": "&#96;", "~": "&#126;", "[": "&#91;", "\\": "&#92;"})
_INDENT = re.compile(r"^[ \t]+", re.M)


def _keep_indent(match: re.Match) -> str:
    width = len(match.group(0).expandtabs(4))
    return "&nbsp;" * width if width >= 4 else match.group(0)  # 4+ columns would open a code block


def literal_html(text: str) -> str:
    """Chat text for a Markdown view that shows HTML, code fences and links exactly as typed."""
    return _INDENT.sub(_keep_indent, text.translate(_INERT))


def literal_chat(messages: list[dict]) -> list[dict]:
    """Chatbot messages with ``literal_html`` applied to each content."""
    return [{**m, "content": literal_html(m["content"])} for m in messages]


# ---- leaderboard -----------------------------------------------------------------------------------
def rated_votes(comparisons: Iterable[Comparison]) -> list[dict]:
    """Vote rows for rlhf.analysis.leaderboard: comparisons between two different, known versions."""
    return [{"policy_a": c.policy_a_id, "policy_b": c.policy_b_id, "winner": c.winner,
             **({"text_a": c.text_a, "text_b": c.text_b} if c.text_a is not None and c.text_b is not None else {})}
            for c in comparisons
            if c.policy_a_id is not None and c.policy_b_id is not None and c.policy_a_id != c.policy_b_id]


def board(comparisons: Iterable[Comparison], policies: list[Policy], n_boot: int = BOOTSTRAP_ROUNDS,
          seed: int = 0) -> pd.DataFrame:
    """Leaderboard of an agent's versions (Elo, BT, bootstrap CI, counts) with a ``status`` column."""
    table = leaderboard(rated_votes(comparisons), [{"policy_id": p.id, "version": p.version} for p in policies],
                        n_boot=n_boot, seed=seed)
    table.insert(2, "status", table["policy_id"].map({p.id: p.status for p in policies}))
    return table


def leaderboard_json(table: pd.DataFrame) -> list[dict]:
    """Leaderboard rows as JSON-safe dicts (NaN becomes None)."""
    rows = []
    for rec in table.to_dict(orient="records"):
        row = {}
        for key, value in rec.items():
            if hasattr(value, "item"):  # numpy scalar -> Python
                value = value.item()
            row[key] = None if isinstance(value, float) and math.isnan(value) else value
        rows.append(row)
    return rows


BT_VS_ELO = ("**Reading the ratings.** *BT* (Bradley–Terry) fits all votes at once, so their order does not "
             "matter, and its 95% interval comes from resampling the votes; *Elo* updates vote by vote, so the latest "
             "votes weigh most and the same votes in another order give another number. With few votes the two "
             "disagree: go by BT and its interval. Versions whose intervals overlap share a *rank*; one vote gives "
             "no interval yet.")


def has_interval(low: Any, high: Any) -> bool:
    """True for a bootstrap interval with width (one vote, or none, gives a point or nothing)."""
    return not missing(low) and not missing(high) and float(high) - float(low) >= 0.5


def interval_text(low: Any, high: Any, votes: int) -> str:
    """"950 – 1050", or why there is no interval: no votes yet, or too few for the votes to vary."""
    if has_interval(low, high):
        return f"{low:.0f} – {high:.0f}"
    if not votes:
        return "no votes yet"
    return f"no interval yet ({votes} vote{'' if votes == 1 else 's'})"


def shared_ranks(table: pd.DataFrame) -> list[int]:
    """Ranks in the table's order where ties are ties: 1 + the versions whose interval lies wholly above this
    one's (a version without an interval counts as the point at its rating), as LMArena ranks models."""
    spans = [(float(r.ci_low), float(r.ci_high)) if has_interval(r.ci_low, r.ci_high) else (float(r.bt),) * 2
             for r in table.itertuples(index=False)]
    return [1 + sum(1 for low, _ in spans if low > high + 1e-9) for _, high in spans]


def leaderboard_view(table: pd.DataFrame) -> pd.DataFrame:
    """The leaderboard as shown in the Arena tab (best BT rating first; overlapping intervals share a rank)."""
    rows = []
    for rank, row in zip(shared_ranks(table), table.itertuples(index=False)):
        rows.append({"Rank": rank, "Version": f"v{row.version}", "Status": row.status,
                     "BT rating": fmt(row.bt, 0), "95% CI": interval_text(row.ci_low, row.ci_high, int(row.votes)),
                     "Style-controlled": _style(row), "Elo": fmt(row.elo, 0), "Votes": int(row.votes),
                     "W / L / T": f"{row.wins} / {row.losses} / {row.ties}",
                     "Both bad": int(row.both_bad), "Win rate": fmt(row.win_rate, 0, percent=True)})
    return pd.DataFrame(rows, columns=["Rank", "Version", "Status", "BT rating", "95% CI", "Style-controlled", "Elo",
                                       "Votes", "W / L / T", "Both bad", "Win rate"])


def _style(row: Any) -> str:
    """The style-controlled BT rating with its interval (length and markdown as covariates), or a dash."""
    value = getattr(row, "bt_style", None)
    if missing(value):
        return DASH
    if not has_interval(row.style_low, row.style_high):  # one vote: resampling cannot vary it, no interval yet
        return fmt(value, 0) + " (no interval yet)"
    return fmt(value, 0) + f" [{row.style_low:.0f} – {row.style_high:.0f}]"


def win_rate_view(comparisons: Iterable[Comparison], policies: list[Policy]) -> pd.DataFrame:
    """Win rate of the row version against the column version (ties half), as percentages."""
    ordered = sorted(policies, key=lambda p: p.version)
    ids = [p.id for p in ordered]
    labels = [f"v{p.version}" for p in ordered]
    matrix = win_rate_matrix(rated_votes(comparisons), ids).reindex(index=ids, columns=ids)
    frame = pd.DataFrame([[fmt(matrix.at[r, c], 0, percent=True) if r != c else DASH for c in ids] for r in ids],
                         columns=labels)
    frame.insert(0, "row beats →", labels)
    return frame


# ---- dashboard -------------------------------------------------------------------------------------
VERSION_COLUMNS = ["Version", "Parent", "Created", "Status", "Feedback used", "RM accuracy", "Gate", "Eval reward",
                   "KL to base", "BT [95% CI]", "Elo", "Votes"]


def rm_accuracy_text(m: dict) -> Optional[str]:
    """Cross-validated reward-model accuracy with its 95% interval; "too few votes" when it includes chance."""
    acc, low, high = m.get("cv_accuracy"), m.get("cv_low"), m.get("cv_high")
    if missing(acc) or missing(low) or missing(high):
        return None
    if low <= 0.5 <= high:
        return f"too few votes to tell ({acc:.0%}, {low:.0%}–{high:.0%})"
    return f"{acc:.0%} [{low:.0%}–{high:.0%}]"


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
                     "Created": short_time(p.created), "Status": p.status,
                     "Feedback used": str(int(used)) if not missing(used) else DASH,
                     "RM accuracy": cv or fmt(rm_acc, 0, percent=True), "Gate": gate_text(m),
                     "Eval reward": fmt(m.get("eval/reward") if not missing(m.get("eval/reward"))
                                        else eval_rewards.get(p.id), 3),
                     "KL to base": fmt(m.get("eval/kl"), 2), "Elo": fmt(r.get("elo"), 0), "BT [95% CI]": bt,
                     "Votes": int(r.get("votes", 0))})
    return pd.DataFrame(rows, columns=VERSION_COLUMNS)


PALETTE = ("#3b82f6", "#f97316", "#10b981", "#ef4444", "#8b5cf6", "#eab308", "#06b6d4", "#ec4899")


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


# ---- arena -----------------------------------------------------------------------------------------
WINNER_TEXT = {"a": "you preferred **A**", "b": "you preferred **B**", "tie": "you called it a **tie**",
               "both_bad": "you found **both bad**"}


def reveal_text(winner: str, policy_a: Optional[Policy], policy_b: Optional[Policy], comparison_id: int) -> str:
    """What the arena shows after the vote: which version wrote which side."""
    name = lambda p: status_label(p) if p is not None else "unknown version"  # noqa: E731
    after = ("Both replies were bad, so this conversation ends here: **Start over** for a new round."
             if winner == "both_bad" else "Type a follow-up to **continue** under the preferred reply, "
                                          "or **Start over**.")
    return (f"**A** was **{name(policy_a)}** · **B** was **{name(policy_b)}** — {WINNER_TEXT[winner]} "
            f"(stored as comparison #{comparison_id}). {after}")
