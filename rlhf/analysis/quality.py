"""Annotation quality: per-annotator stats, agreement with the majority, Krippendorff's alpha, flagged replies.

Pure functions over ``Store.feedback_rows(agent)`` (plain dicts; pandas and numpy only). An annotator's
judgement of an item is their *effective* one: for a reply, the latest non-null thumb / score / flags
(ratings are append-only events); for a pair of replies, their latest vote on that pair.

Items judged by at least two named annotators are *overlapping*; agreement and alpha use only those.
Anonymous feedback (no annotator name) is counted but never compared: it may come from many people.
"""
from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from itertools import permutations
from typing import Hashable, Iterable, Optional

import numpy as np
import pandas as pd

from storage.ratings import fold_ratings

ANONYMOUS = "(anonymous)"
TIME_CAP_SECONDS = 300.0  # a longer gap between two items is a break, not work on the item
STAT_COLUMNS = ["annotator", "ratings", "votes", "items", "overlap_items", "agreement", "median_seconds",
                "excluded"]


# ---- Krippendorff's alpha ------------------------------------------------------------------------
def krippendorff_alpha(units: Iterable[Iterable], metric: str = "nominal") -> Optional[float]:
    """Krippendorff's alpha over units (each the values its coders gave; missing values left out).

    alpha = 1 - D_o / D_e (Krippendorff 2011, "Computing Krippendorff's Alpha-Reliability", eq. for the
    coincidence matrix): o_ck sums, over units with m_u >= 2 values, every ordered pair of values (c, k)
    from different coders weighted 1 / (m_u - 1); n_c = sum_k o_ck, n = sum_c n_c;
    D_o = sum_ck o_ck d2(c, k) / n and D_e = sum_ck n_c n_k d2(c, k) / (n (n - 1)), with d2 = [c != k]
    (nominal) or (c - k)^2 (interval). None when no unit is pairable or every value is the same (D_e = 0).

    Worked by hand, nominal, units (a, a), (a, b), (b, b): o_aa = 2, o_ab = o_ba = 1, o_bb = 2, n = 6,
    n_a = n_b = 3; D_o = 2/6, D_e = (3*3 + 3*3)/(6*5) = 0.6; alpha = 1 - (1/3)/0.6 = 4/9.
    """
    if metric not in ("nominal", "interval"):
        raise ValueError(f"metric must be nominal or interval, got {metric!r}")
    coincidence: dict[tuple, float] = defaultdict(float)
    for unit in units:
        values = [v for v in unit if v is not None and not (isinstance(v, float) and np.isnan(v))]
        m = len(values)
        if m < 2:
            continue  # a value nobody else coded cannot disagree with anything
        for i, j in permutations(range(m), 2):
            coincidence[(values[i], values[j])] += 1.0 / (m - 1)
    if not coincidence:
        return None
    n_c: dict = defaultdict(float)
    for (c, _), weight in coincidence.items():
        n_c[c] += weight
    n = sum(n_c.values())

    def d2(c, k) -> float:
        return float(c != k) if metric == "nominal" else (float(c) - float(k)) ** 2

    d_observed = sum(w * d2(c, k) for (c, k), w in coincidence.items()) / n
    d_expected = sum(n_c[c] * n_c[k] * d2(c, k) for c in n_c for k in n_c) / (n * (n - 1))
    if d_expected == 0:
        return None
    return 1.0 - d_observed / d_expected


# ---- effective judgements ------------------------------------------------------------------------
def _name(annotator: Optional[str]) -> str:
    return annotator if annotator else ANONYMOUS


def effective_ratings(rows: dict) -> dict[tuple[str, int], dict]:
    """(annotator, message id) → latest non-null thumb, score and flags (a withdrawn one counts as none), and the
    first event's time."""
    events: dict[tuple[str, int], list[dict]] = {}
    for r in sorted(rows["ratings"], key=lambda r: r["id"]):
        events.setdefault((_name(r.get("annotator")), r["message_id"]), []).append(r)
    out = {}
    for key, rs in events.items():
        folded = fold_ratings(rs)
        out[key] = {"thumb": folded["thumb"], "score": folded["score"], "flags": folded["flags"],
                    "first": rs[0]["created"]}
    return out


def pair_key(message_a_id: int, message_b_id: int, winner: str) -> tuple[tuple[int, int], str]:
    """A vote as (unordered pair, outcome) with the outcome relative to the lower message id, so
    "a wins (a=7, b=3)" and "b wins (a=3, b=7)" are the same judgement."""
    low, high = sorted((message_a_id, message_b_id))
    if winner in ("a", "b"):
        winner_id = message_a_id if winner == "a" else message_b_id
        return (low, high), "low" if winner_id == low else "high"
    return (low, high), winner


def effective_votes(rows: dict) -> dict[tuple[str, tuple[int, int]], dict]:
    """(annotator, unordered pair) → latest outcome and the first vote's time."""
    out: dict = {}
    for c in sorted(rows["comparisons"], key=lambda c: c["id"]):
        pair, outcome = pair_key(c["message_a_id"], c["message_b_id"], c["winner"])
        key = (_name(c.get("annotator")), pair)
        first = out[key]["first"] if key in out else c["created"]
        out[key] = {"outcome": outcome, "first": first}
    return out


def _by_item(judgements: dict, field: str) -> dict[Hashable, dict[str, object]]:
    """item → {annotator: value} for named annotators with a value in ``field``."""
    items: dict = defaultdict(dict)
    for (who, item), state in judgements.items():
        if who != ANONYMOUS and state.get(field) is not None:
            items[item][who] = state[field]
    return items


# ---- agreement -----------------------------------------------------------------------------------
def _agrees(value, others: list, kind: str) -> Optional[bool]:
    """Does a judgement agree with the majority of the *other* annotators? None when they have no majority.

    Nominal kinds (thumbs, votes): equal to the others' most common value, when it is unique. Scores: within
    one point of the others' median (1-5 scores are ordinal; off-by-one is ordinary noise).
    """
    if kind == "score":
        return abs(float(value) - float(np.median(others))) <= 1.0
    counts = pd.Series(others).value_counts()
    if len(counts) > 1 and counts.iloc[0] == counts.iloc[1]:
        return None
    return value == counts.index[0]


def agreement_by_annotator(rows: dict) -> dict[str, dict]:
    """annotator → {overlap_items, agreed, compared}: leave-one-out majority agreement on overlapping items."""
    ratings, votes = effective_ratings(rows), effective_votes(rows)
    out: dict[str, dict] = defaultdict(lambda: {"overlap_items": set(), "agreed": 0, "compared": 0})
    for kind, judgements, field in (("thumb", ratings, "thumb"), ("score", ratings, "score"),
                                    ("vote", votes, "outcome")):
        for item, by_who in _by_item(judgements, field).items():
            if len(by_who) < 2:
                continue
            for who, value in by_who.items():
                out[who]["overlap_items"].add((kind, item))
                verdict = _agrees(value, [v for w, v in by_who.items() if w != who], kind)
                if verdict is not None:
                    out[who]["compared"] += 1
                    out[who]["agreed"] += int(verdict)
    return {who: {"overlap_items": len(v["overlap_items"]), "agreed": v["agreed"], "compared": v["compared"]}
            for who, v in out.items()}


def alpha_report(rows: dict) -> dict:
    """Krippendorff's alpha on overlapping items: thumbs (nominal), scores (interval), votes (nominal)."""
    ratings, votes = effective_ratings(rows), effective_votes(rows)
    report = {}
    for kind, judgements, field, metric in (("thumbs", ratings, "thumb", "nominal"),
                                            ("scores", ratings, "score", "interval"),
                                            ("votes", votes, "outcome", "nominal")):
        units = [list(by_who.values()) for by_who in _by_item(judgements, field).values() if len(by_who) >= 2]
        report[kind] = {"alpha": krippendorff_alpha(units, metric), "units": len(units), "metric": metric}
    return report


# ---- time per item -------------------------------------------------------------------------------
def _seconds(a: str, b: str) -> float:
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


def median_seconds_per_item(rows: dict, cap: float = TIME_CAP_SECONDS) -> dict[str, Optional[float]]:
    """annotator → median gap between the starts of consecutive items (replies rated, pairs voted), capped."""
    starts: dict[str, list[str]] = defaultdict(list)
    for (who, _), state in list(effective_ratings(rows).items()) + list(effective_votes(rows).items()):
        starts[who].append(state["first"])
    out: dict[str, Optional[float]] = {}
    for who, stamps in starts.items():
        stamps.sort()
        gaps = [min(cap, max(0.0, _seconds(a, b))) for a, b in zip(stamps, stamps[1:])]
        out[who] = float(np.median(gaps)) if gaps else None
    return out


# ---- tables ---------------------------------------------------------------------------------------
def annotator_stats(rows: dict, cap: float = TIME_CAP_SECONDS) -> pd.DataFrame:
    """One row per annotator: ratings, votes, items, overlap_items, agreement (0..1), median_seconds, excluded."""
    excluded = set(rows.get("excluded_annotators") or [])
    n_ratings = pd.Series([_name(r.get("annotator")) for r in rows["ratings"]], dtype=object).value_counts()
    n_votes = pd.Series([_name(c.get("annotator")) for c in rows["comparisons"]], dtype=object).value_counts()
    items: dict[str, int] = defaultdict(int)
    for who, _ in list(effective_ratings(rows)) + list(effective_votes(rows)):
        items[who] += 1
    agreement = agreement_by_annotator(rows)
    timing = median_seconds_per_item(rows, cap)
    names = sorted(set(n_ratings.index) | set(n_votes.index))
    records = []
    for who in names:
        a = agreement.get(who, {"overlap_items": 0, "agreed": 0, "compared": 0})
        records.append({"annotator": who, "ratings": int(n_ratings.get(who, 0)), "votes": int(n_votes.get(who, 0)),
                        "items": items.get(who, 0), "overlap_items": a["overlap_items"],
                        "agreement": a["agreed"] / a["compared"] if a["compared"] else None,
                        "median_seconds": timing.get(who), "excluded": who in excluded})
    return pd.DataFrame(records, columns=STAT_COLUMNS)


def own_stats(stats: pd.DataFrame, name: Optional[str], admin: bool) -> pd.DataFrame:
    """The rows of ``annotator_stats`` a caller may see: every annotator's for admins, their own for others (a named
    annotator's counts, read before and after a vote, would tell how they voted)."""
    if admin:
        return stats
    return stats[stats["annotator"] == name].reset_index(drop=True) if name else stats.iloc[0:0]


def _prompt_text(rows_by_id: dict, message: dict) -> str:
    parent = rows_by_id.get(message.get("parent_id"))
    return parent["content"] if parent else ""


def feedback_frame(rows: dict, max_chars: int = 200) -> pd.DataFrame:
    """Every feedback event as one table row (ratings and votes), newest first, for filtering; ``withdrawn`` names
    a rating event's fields taken back since ("thumb", "score")."""
    messages = {m["id"]: m for m in rows["messages"]}
    excluded = set(rows.get("excluded_annotators") or [])
    out = []
    for r in rows["ratings"]:
        msg = messages.get(r["message_id"], {})
        out.append({"kind": "rating", "id": r["id"], "created": r["created"], "annotator": _name(r.get("annotator")),
                    "message_id": r["message_id"], "other_id": None, "thumb": r.get("thumb"),
                    "score": r.get("score"), "flags": ", ".join(r.get("flags") or []), "note": r.get("note") or "",
                    "winner": "", "prompt": _prompt_text(messages, msg)[:max_chars],
                    "reply": (msg.get("content") or "")[:max_chars], "withdrawn": ", ".join(r.get("withdrawn") or [])})
    for c in rows["comparisons"]:
        a, b = messages.get(c["message_a_id"], {}), messages.get(c["message_b_id"], {})
        out.append({"kind": "vote", "id": c["id"], "created": c["created"], "annotator": _name(c.get("annotator")),
                    "message_id": c["message_a_id"], "other_id": c["message_b_id"], "thumb": None, "score": None,
                    "flags": "", "note": "", "winner": c["winner"], "prompt": _prompt_text(messages, a)[:max_chars],
                    "reply": f"A: {(a.get('content') or '')[:max_chars // 2]} | B: {(b.get('content') or '')[:max_chars // 2]}",
                    "withdrawn": ""})
    frame = pd.DataFrame(out, columns=["kind", "id", "created", "annotator", "message_id", "other_id", "thumb",
                                       "score", "flags", "note", "winner", "prompt", "reply", "withdrawn"])
    frame["excluded"] = frame["annotator"].isin(excluded)
    return frame.sort_values("created", ascending=False, kind="stable").reset_index(drop=True)


def filter_feedback(frame: pd.DataFrame, annotator: Optional[str] = None, kind: Optional[str] = None,
                    flag: Optional[str] = None, text: Optional[str] = None) -> pd.DataFrame:
    """Rows of ``feedback_frame`` matching every given filter (None / "" / "all" = no filter)."""
    keep = pd.Series(True, index=frame.index)
    if annotator not in (None, "", "all"):
        keep &= frame["annotator"] == annotator
    if kind not in (None, "", "all"):
        keep &= frame["kind"] == kind
    if flag not in (None, "", "all"):
        keep &= frame["flags"].str.contains(flag, regex=False)
    if text:
        needle = text.lower()
        keep &= (frame["prompt"].str.lower().str.contains(needle, regex=False)
                 | frame["reply"].str.lower().str.contains(needle, regex=False)
                 | frame["note"].str.lower().str.contains(needle, regex=False))
    return frame[keep].reset_index(drop=True)


def flagged_replies(rows: dict, max_chars: int = 300) -> pd.DataFrame:
    """Replies whose effective rating by some annotator carries flags: one row per reply, most flagged first."""
    messages = {m["id"]: m for m in rows["messages"]}
    by_reply: dict[int, dict] = {}
    for (who, message_id), state in effective_ratings(rows).items():
        if not state["flags"]:
            continue
        entry = by_reply.setdefault(message_id, {"flags": defaultdict(int), "annotators": set()})
        for flag in state["flags"]:
            entry["flags"][flag] += 1
        entry["annotators"].add(who)
    out = []
    for message_id, entry in by_reply.items():
        msg = messages.get(message_id, {})
        out.append({"message_id": message_id, "policy_id": msg.get("policy_id"),
                    "flags": ", ".join(f"{f} ×{n}" for f, n in sorted(entry["flags"].items())),
                    "n_flags": sum(entry["flags"].values()), "annotators": ", ".join(sorted(entry["annotators"])),
                    "prompt": _prompt_text(messages, msg)[:max_chars], "reply": (msg.get("content") or "")[:max_chars]})
    frame = pd.DataFrame(out, columns=["message_id", "policy_id", "flags", "n_flags", "annotators", "prompt", "reply"])
    return frame.sort_values(["n_flags", "message_id"], ascending=[False, False]).reset_index(drop=True)
