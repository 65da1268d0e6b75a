"""The Data tab's statistics, computed once per change of the feedback, not once per refresh.

Reading an agent's feedback and computing per-annotator statistics, Krippendorff's alpha and the flagged replies
takes a few hundred milliseconds on a few thousand rows; the tab refreshes on a timer, on every tab switch and on
every filter change, for every person who has it open. ``FeedbackStats.get`` keys the result on the Store's
``feedback_mark`` (a handful of indexed ``MAX(id)`` lookups) and recomputes only when it moved.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import pandas as pd

from rlhf.analysis import quality
from storage import Store


@dataclass(frozen=True)
class AgentStats:
    """One agent's feedback as the Data tab shows it, before any per-person filter."""

    frame: pd.DataFrame  # every feedback event (quality.feedback_frame)
    stats: pd.DataFrame  # per annotator (quality.annotator_stats)
    alpha: dict  # quality.alpha_report
    flagged: pd.DataFrame  # quality.flagged_replies


class FeedbackStats:
    """``get(agent_id)``: the agent's ``AgentStats``, the same object until the feedback changes."""

    def __init__(self, store: Store):
        self.store = store
        self._cache: dict[int, tuple[tuple, AgentStats]] = {}
        self._lock = threading.Lock()  # one computation at a time: who arrives meanwhile gets its result

    def get(self, agent_id: int) -> AgentStats:
        with self._lock:
            mark = self.store.feedback_mark()
            hit = self._cache.get(agent_id)
            if hit is not None and hit[0] == mark:
                return hit[1]
            rows = self.store.feedback_rows(agent_id)
            result = AgentStats(quality.feedback_frame(rows), quality.annotator_stats(rows),
                                quality.alpha_report(rows), quality.flagged_replies(rows))
            self._cache[agent_id] = (mark, result)
            return result
