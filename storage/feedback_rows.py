"""Read-only views of an agent's feedback for the data builders (training, exports, stats, the scheduler)."""
from __future__ import annotations

import json
from typing import Optional

from storage.errors import InvalidInput


class FeedbackExportMixin:
    """Read-only views of an agent's feedback for the data builders (training, exports, stats)."""

    def feedback_watermark(self, agent: int | str) -> dict:
        """Highest rating, comparison and withdrawal ids of an agent: a snapshot of 'the feedback used so far'."""
        agent_id = self.get_agent(agent).id
        r = self._one("""SELECT COALESCE(MAX(r.id), 0) AS m FROM ratings r JOIN messages m ON m.id = r.message_id
                         JOIN conversations c ON c.id = m.conversation_id WHERE c.agent_id = ?""", [agent_id])
        c = self._one("""SELECT COALESCE(MAX(x.id), 0) AS m FROM comparisons x JOIN messages m ON m.id = x.message_a_id
                         JOIN conversations c ON c.id = m.conversation_id WHERE c.agent_id = ?""", [agent_id])
        w = self._one("""SELECT COALESCE(MAX(w.id), 0) AS m FROM rating_withdrawals w JOIN ratings r ON r.id = w.rating_id
                         JOIN messages m ON m.id = r.message_id JOIN conversations c ON c.id = m.conversation_id
                         WHERE c.agent_id = ?""", [agent_id])
        # "withdrawal_id" only once there is one: a watermark without it (also every one from before withdrawals
        # existed) means "no withdrawals yet", and the watermarks stored with older versions stay comparable.
        return {"rating_id": r["m"], "comparison_id": c["m"], **({"withdrawal_id": w["m"]} if w["m"] else {})}

    def feedback_snapshot(self, agent: int | str) -> tuple[dict, dict]:
        """(watermark, rows) read in one read transaction: the rows hold exactly the store at the watermark's
        moment, so no conversation, message, rating or comparison written after it is in them (a WAL reader
        sees one moment). What one retrain trains its reward model and its policy on."""
        with self.reading():
            watermark = self.feedback_watermark(agent)
            rows = self.feedback_rows(agent, until=watermark)
        return watermark, rows

    def count_feedback_since(self, agent: int | str, watermark: Optional[dict]) -> int:
        """Ratings + comparisons + withdrawals of an agent newer than a watermark (None = all)."""
        if not watermark:
            watermark = {"rating_id": 0, "comparison_id": 0, "withdrawal_id": 0}
        agent_id = self.get_agent(agent).id
        r = self._one("""SELECT COUNT(*) AS n FROM ratings r JOIN messages m ON m.id = r.message_id
                         JOIN conversations c ON c.id = m.conversation_id WHERE c.agent_id = ? AND r.id > ?""",
                      [agent_id, watermark.get("rating_id", 0)])["n"]
        x = self._one("""SELECT COUNT(*) AS n FROM comparisons x JOIN messages m ON m.id = x.message_a_id
                         JOIN conversations c ON c.id = m.conversation_id WHERE c.agent_id = ? AND x.id > ?""",
                      [agent_id, watermark.get("comparison_id", 0)])["n"]
        w = self._one("""SELECT COUNT(*) AS n FROM rating_withdrawals w JOIN ratings r ON r.id = w.rating_id
                         JOIN messages m ON m.id = r.message_id JOIN conversations c ON c.id = m.conversation_id
                         WHERE c.agent_id = ? AND w.id > ?""", [agent_id, watermark.get("withdrawal_id", 0)])["n"]
        return r + x + w

    def feedback_volume(self, agent: int | str, per: str = "hour") -> list[dict]:
        """Ratings and comparisons of an agent per UTC hour (or ``per="minute"``): dicts with hour
        ('YYYY-MM-DDTHH', or 'YYYY-MM-DDTHH:MM' per minute), kind, n."""
        if per not in ("hour", "minute"):
            raise InvalidInput(f"per must be 'hour' or 'minute', got {per!r}")
        agent_id = self.get_agent(agent).id
        width = 13 if per == "hour" else 16  # created is an ISO string: its first 13 (16) characters are the bucket
        return self._all("""
            SELECT hour, kind, COUNT(*) AS n FROM (
                SELECT substr(r.created, 1, ?) AS hour, 'ratings' AS kind FROM ratings r
                JOIN messages m ON m.id = r.message_id JOIN conversations c ON c.id = m.conversation_id
                WHERE c.agent_id = ?
                UNION ALL
                SELECT substr(x.created, 1, ?), 'comparisons' FROM comparisons x
                JOIN messages m ON m.id = x.message_a_id JOIN conversations c ON c.id = m.conversation_id
                WHERE c.agent_id = ?)
            GROUP BY hour, kind ORDER BY hour, kind""", [width, agent_id, width, agent_id])

    def feedback_mark(self) -> tuple:
        """A cheap mark that changes whenever ``feedback_rows`` of any agent may: the newest id of each table it
        reads (feedback is append-only, so ids only grow) and who is excluded now. Equal marks, equal rows."""
        row = self._one("""SELECT (SELECT MAX(id) FROM conversations), (SELECT MAX(id) FROM messages),
                                  (SELECT MAX(id) FROM ratings), (SELECT MAX(id) FROM comparisons),
                                  (SELECT MAX(id) FROM rating_withdrawals), (SELECT MAX(id) FROM annotators),
                                  (SELECT group_concat(id) FROM annotators WHERE excluded = 1)""")
        return tuple(row.values())

    def feedback_rows(self, agent: int | str, until: Optional[dict] = None) -> dict:
        """Everything the data builders need for one agent, as plain rows (dicts).

        Keys: conversations, messages, ratings, comparisons, withdrawals (each a list of dicts, annotator by name,
        JSON decoded; the comparisons that count, as ``list_comparisons`` gives them) and excluded_annotators.
        A rating row's ``withdrawn`` lists the fields taken back since (``withdraw_rating``); ``fold_ratings`` honours
        it. ``until`` (a watermark) freezes the snapshot; a watermark from before withdrawals existed has none.
        """
        with self.reading():  # one moment: a conversation written between two reads would miss its messages' rows
            return self._feedback_rows(self.get_agent(agent).id,
                                       until or {"rating_id": 2**62, "comparison_id": 2**62, "withdrawal_id": 2**62})

    def _feedback_rows(self, agent_id: int, until: dict) -> dict:
        conversations = self._all("""SELECT c.id, c.system_prompt, c.source, c.created, a.name AS annotator
                                     FROM conversations c LEFT JOIN annotators a ON a.id = c.annotator_id
                                     WHERE c.agent_id = ? ORDER BY c.id""", [agent_id])
        messages = self._all("""SELECT m.id, m.conversation_id, m.parent_id, m.role, m.content, m.context_key,
                                m.policy_id, m.created FROM messages m JOIN conversations c ON c.id = m.conversation_id
                                WHERE c.agent_id = ? ORDER BY m.id""", [agent_id])
        ratings = self._all("""SELECT r.id, r.message_id, a.name AS annotator, r.thumb, r.score, r.flags, r.note,
                               r.created, (SELECT json_group_array(w.field) FROM rating_withdrawals w
                                           WHERE w.rating_id = r.id AND w.id <= ?) AS withdrawn
                               FROM ratings r JOIN messages m ON m.id = r.message_id
                               JOIN conversations c ON c.id = m.conversation_id
                               LEFT JOIN annotators a ON a.id = r.annotator_id
                               WHERE c.agent_id = ? AND r.id <= ? ORDER BY r.id""",
                            [until.get("withdrawal_id", 0), agent_id, until["rating_id"]])
        for r in ratings:
            r["flags"] = json.loads(r["flags"]) if r["flags"] is not None else None
            r["withdrawn"] = json.loads(r["withdrawn"])
        keys = ("id", "message_a_id", "message_b_id", "policy_a_id", "policy_b_id", "winner", "annotator", "pair_id",
                "created")
        comparisons = [{k: r[k] for k in keys} for r in self._counted_comparisons(agent_id, until["comparison_id"])]
        withdrawals = self._all("""SELECT w.id, w.rating_id, r.message_id, a.name AS annotator, w.field, w.created
                                   FROM rating_withdrawals w JOIN ratings r ON r.id = w.rating_id
                                   JOIN messages m ON m.id = r.message_id
                                   JOIN conversations c ON c.id = m.conversation_id
                                   LEFT JOIN annotators a ON a.id = r.annotator_id
                                   WHERE c.agent_id = ? AND w.id <= ? AND r.id <= ? ORDER BY w.id""",
                                [agent_id, until.get("withdrawal_id", 0), until["rating_id"]])
        excluded = [r["name"] for r in self._all("SELECT name FROM annotators WHERE excluded = 1")]
        return {"conversations": conversations, "messages": messages, "ratings": ratings,
                "comparisons": comparisons, "withdrawals": withdrawals, "excluded_annotators": excluded}
