"""Ratings: append-only label events on a reply (thumb, score, flags, note), withdrawals of a thumb or a score, and
the one fold that turns an annotator's events into their current rating."""
from __future__ import annotations

import math
from typing import Any, Iterable, Optional

from storage.errors import InvalidInput, NotFound
from storage.records import Rating, Withdrawal
from storage.util import check_id, check_text, dumps, utcnow

FLAGS = ("Inaccurate", "Unsafe", "Off-topic", "Unhelpful")
RATING_FIELDS = ("thumb", "score", "flags", "note")
# A thumb or a score cannot be set to "none" by a new event (flags can be emptied, a note blanked): they are withdrawn.
WITHDRAWABLE = ("thumb", "score")
# A rating event with the fields taken back since (``withdraw_rating``), as a JSON list: what every fold reads.
_RATING = ("r.*, (SELECT json_group_array(w.field) FROM rating_withdrawals w WHERE w.rating_id = r.id) "
           "AS withdrawn")


def _check_int(value: Any, what: str, allowed: Iterable[int]) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{what} must be a number in {sorted(allowed)}, got {value!r}")
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value) or not value.is_integer()):
        raise InvalidInput(f"{what} must be a whole number in {sorted(allowed)}, got {value!r}")
    if int(value) not in allowed:
        raise InvalidInput(f"{what} must be one of {sorted(allowed)}, got {value!r}")
    return int(value)


class RatingsMixin:
    """Methods of Store that record, withdraw and read ratings."""

    def record_rating(self, message_id: int, annotator: Optional[str] = None, thumb: Any = None,
                      score: Any = None, flags: Any = None, note: Any = None) -> Rating:
        """Append a rating event (None = field unchanged). A repeat that changes nothing stores nothing."""
        msg = self.get_message(message_id)
        if msg.role != "assistant":
            raise InvalidInput(f"message {message_id} is a {msg.role} message; only replies can be rated")
        if thumb is None and score is None and flags is None and note is None:
            raise InvalidInput("a rating needs at least one of thumb, score, flags, note")
        if thumb is not None:
            thumb = _check_int(thumb, "thumb", (-1, 1))
        if score is not None:
            score = _check_int(score, "score", range(1, 6))
        if flags is not None:
            if not isinstance(flags, (list, tuple)) or not all(isinstance(f, str) for f in flags):
                raise InvalidInput("flags must be a list of strings")
            unknown = [f for f in flags if f not in FLAGS]
            if unknown:
                raise InvalidInput(f"unknown flags {unknown}; allowed: {list(FLAGS)}")
            flags = sorted(set(flags))
        if note is not None:
            note = check_text(note, "note", self.max_text_chars, allow_empty=True)
        annotator_id = self.annotator_id(annotator)
        event = {"thumb": thumb, "score": score, "flags": flags, "note": note}
        with self._tx() as db:
            current = self._effective(message_id, annotator_id)
            if current is not None and all(v is None or current.get(k) == v for k, v in event.items()):
                return self.get_rating(current["id"])
            rating_id = self._insert(db, "ratings", {
                "message_id": message_id, "annotator_id": annotator_id, "thumb": thumb, "score": score,
                "flags": dumps(flags) if flags is not None else None, "note": note, "created": utcnow()})
        return self.get_rating(rating_id)

    def _effective(self, message_id: int, annotator_id: Optional[int]) -> Optional[dict]:
        rows = self._all(f"SELECT {_RATING} FROM ratings r WHERE r.message_id = ? AND r.annotator_id IS ? ORDER BY r.id",
                         [message_id, annotator_id])
        return fold_ratings([Rating.from_row(r) for r in rows])

    def _named(self, annotator: Optional[str]) -> tuple[bool, Optional[int]]:
        """(known?, id) of an annotator name without creating it; None or blank is the anonymous one."""
        if annotator is None or not annotator.strip():
            return True, None
        row = self._one("SELECT id FROM annotators WHERE name = ?", [annotator.strip()])
        return (row is not None), (row["id"] if row else None)

    def effective_rating(self, message_id: int, annotator: Optional[str] = None) -> Optional[dict]:
        """An annotator's current rating of a reply (thumb, score, flags, note), or None."""
        known, annotator_id = self._named(annotator)
        return self._effective(message_id, annotator_id) if known else None

    def withdraw_rating(self, message_id: int, annotator: Optional[str] = None,
                        field: str = "thumb") -> Optional[Withdrawal]:
        """Take back an annotator's current thumb (or score) on a reply: an append-only withdrawal event pointing at
        the rating event that set it. With nothing to take back (no such value, or already taken back) nothing is
        stored and None comes back, so a repeated click stores one withdrawal."""
        if field not in WITHDRAWABLE:
            raise InvalidInput(f"field must be one of {list(WITHDRAWABLE)}, got {field!r}")
        msg = self.get_message(message_id)
        if msg.role != "assistant":
            raise InvalidInput(f"message {message_id} is a {msg.role} message; only replies carry ratings")
        known, annotator_id = self._named(annotator)
        if not known:
            return None
        with self._tx() as db:
            row = self._one(f"""SELECT {_RATING} FROM ratings r WHERE r.message_id = ? AND r.annotator_id IS ?
                                AND r.{field} IS NOT NULL ORDER BY r.id DESC LIMIT 1""", [message_id, annotator_id])
            if row is None or field in Rating.from_row(row).withdrawn:
                return None
            withdrawal_id = self._insert(db, "rating_withdrawals",
                                         {"rating_id": row["id"], "field": field, "created": utcnow()})
        return Withdrawal.from_row(self._one("SELECT * FROM rating_withdrawals WHERE id = ?", [withdrawal_id]))

    def ratings_for(self, message_id: int) -> list[Rating]:
        """Every rating event on a message, oldest first (each with the fields withdrawn since)."""
        self.get_message(message_id)
        return [Rating.from_row(r) for r in
                self._all(f"SELECT {_RATING} FROM ratings r WHERE r.message_id = ? ORDER BY r.id", [message_id])]

    def ratings_by(self, message_id: int, annotator: Optional[str]) -> list[Rating]:
        """One annotator's rating events on a message, oldest first (none for None or an unknown name)."""
        self.get_message(message_id)
        if annotator is None or not annotator.strip():
            return []
        return [Rating.from_row(r) for r in self._all(
            f"""SELECT {_RATING} FROM ratings r JOIN annotators a ON a.id = r.annotator_id
               WHERE r.message_id = ? AND a.name = ? ORDER BY r.id""", [message_id, annotator.strip()])]

    def get_rating(self, rating_id: int) -> Rating:
        row = self._one(f"SELECT {_RATING} FROM ratings r WHERE r.id = ?", [check_id(rating_id, "rating id")])
        if row is None:
            raise NotFound(f"unknown rating {rating_id}")
        return Rating.from_row(row)


def fold_ratings(rows: list) -> Optional[dict]:
    """Effective rating from append-only events, oldest first: the latest non-null value of each field wins, and a
    value its event has had withdrawn counts as none from that event on. Rows are records or dicts (``withdrawn``:
    the fields taken back). The one fold every reader uses: the rating form, the reward data, the statistics."""
    if not rows:
        return None
    state: dict = {"thumb": None, "score": None, "flags": None, "note": None, "id": None}
    for r in rows:
        get = r.get if isinstance(r, dict) else (lambda key, r=r: getattr(r, key, None))
        withdrawn = get("withdrawn") or ()
        for key in RATING_FIELDS:
            value = get(key)
            if value is not None:
                state[key] = None if key in withdrawn else value
        state["id"] = get("id")
    return state
