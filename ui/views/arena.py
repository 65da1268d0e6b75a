"""The Arena page's views: the leaderboard as shown, the win-rate matrix and the reveal after a vote (the REST
leaderboard's JSON rows too)."""
from __future__ import annotations

import math
from typing import Any, Iterable, Optional

import pandas as pd

from rlhf.analysis.arena import rated_votes
from rlhf.analysis.leaderboard import win_rate_matrix
from storage import Comparison, Policy
from ui.views.text import DASH, fmt, missing, status_label


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
