"""View logic of the Chat & Rate tab: the branch shown, its marks, the conversation list and the rating form.

Plain functions over the Store (no Gradio), tested without a browser. The conversation is a tree: a branch is
the path from the first message down to one message; regenerated replies are siblings ("alternatives").
"""
from __future__ import annotations

from typing import Optional

from storage import Message, Store
from ui.flows.chat import is_cut
from ui.views import literal_html, short_time

UNANSWERED = ("⏳ *No reply yet: the page was left (or the reply failed) while it was being written. "
              "Press **Regenerate** to answer it.*")
TITLE_CHARS = 48


def cut_badge(message: Message) -> str:
    """The mark under a reply that stopped at its token limit (empty for one that ended by itself)."""
    if not is_cut(message):
        return ""
    return f"\n\n✂️ *cut: the reply stopped at its {message.gen_params.get('max_new_tokens')}-token limit*"


def shown(message: Message) -> dict:
    """A stored message as the Chatbot shows it: text as typed, a cut reply marked."""
    return {"role": message.role, "content": literal_html(message.content) + cut_badge(message)}


def branch_view(store: Store, leaf_id: Optional[int]) -> tuple[list[dict], list[Optional[int]]]:
    """Chatbot messages and their ids for the branch ending at ``leaf_id``; a user turn without a reply at the end
    gets a placeholder bubble (id None) that says so."""
    if leaf_id is None:
        return [], []
    msgs = store.branch(leaf_id)
    history, ids = [shown(m) for m in msgs], [m.id for m in msgs]
    if msgs[-1].role == "user":
        history.append({"role": "assistant", "content": UNANSWERED})
        ids.append(None)
    return history, ids


def newest_leaf(store: Store, message_id: int) -> int:
    """The newest message at or below ``message_id`` in its conversation: where the branch through it ends."""
    msg = store.get_message(message_id)
    children: dict[Optional[int], list[int]] = {}
    for m in store.conversation_messages(msg.conversation_id):
        children.setdefault(m.parent_id, []).append(m.id)
    below, todo = [message_id], [message_id]
    while todo:
        kids = children.get(todo.pop(), [])
        below += kids
        todo += kids
    return max(below)


def unanswered_leaf(store: Store, ids: list) -> Optional[int]:
    """The user turn at the end of the shown branch when it has no reply yet, else None."""
    real = [i for i in ids if i is not None]
    if not real or ids[-1] is not None:
        return None
    return real[-1]


def last_reply(store: Store, ids: list) -> Optional[int]:
    """The newest reply in the shown branch."""
    return next((i for i in reversed(ids) if i is not None and store.get_message(i).role == "assistant"), None)


def reply_parent(store: Store, ids: list) -> Optional[int]:
    """Where a new user turn goes in the shown branch: under its last reply (beside a turn that never got one)."""
    real = [i for i in ids if i is not None]
    if not real:
        return None
    leaf = store.get_message(real[-1])
    return leaf.parent_id if leaf.role == "user" else leaf.id


def alternative_text(store: Store, reply_id: int) -> str:
    """'alternative 2 of 3' for a reply with regenerated siblings, else ''."""
    siblings = [m.id for m in store.siblings(reply_id)]
    if len(siblings) < 2:
        return ""
    return f"alternative {siblings.index(reply_id) + 1} of {len(siblings)}"


def step_alternative(store: Store, reply_id: int, step: int) -> Optional[int]:
    """The sibling ``step`` places before (-1) or after (+1) a reply, or None at either end."""
    siblings = [m.id for m in store.siblings(reply_id)]
    i = siblings.index(reply_id) + step
    return siblings[i] if 0 <= i < len(siblings) else None


# ---- the conversation list ----------------------------------------------------------------------------
def conversation_label(row: dict) -> str:
    """One line of the list: the first turn, its size, when it was last active, and whether it waits for a reply."""
    title = " ".join(row["title"].split())
    if len(title) > TITLE_CHARS:
        title = title[:TITLE_CHARS - 1] + "…"
    turns = f"{row['turns']} turn" + ("" if row["turns"] == 1 else "s")
    mark = " · ⏳ unanswered" if row["unanswered"] else ""
    return f"{title} · {turns} · {short_time(row['updated'])}{mark}"


def conversation_choices(rows: list[dict]) -> list[tuple[str, int]]:
    """Dropdown choices (label, conversation id), most recently active first."""
    return [(conversation_label(r), r["id"]) for r in rows]


# ---- the rating form ---------------------------------------------------------------------------------
def form_values(rating: Optional[dict]) -> tuple:
    """(score, flags, note) for the form from an annotator's current rating of a reply (empty when none)."""
    rating = rating or {}
    return rating.get("score"), list(rating.get("flags") or []), rating.get("note") or ""


def form_changes(rating: Optional[dict], score, flags, note) -> dict:
    """What the form says that the stored rating does not: the fields of the rating event to store."""
    stored_score, stored_flags, stored_note = form_values(rating)
    changes = {}
    if score not in (None, "") and score != stored_score:
        changes["score"] = score
    flags = sorted(set(flags or []))
    if flags != sorted(stored_flags):
        changes["flags"] = flags
    note = note or ""
    if note.strip() != stored_note.strip():
        changes["note"] = note
    return changes


def form_header(store: Store, reply_id: Optional[int]) -> str:
    """The line over the form: which reply it rates."""
    if reply_id is None:
        return "Select a reply to rate it (click it in the conversation)."
    extra = alternative_text(store, reply_id)
    return f"Rating reply **#{reply_id}**" + (f" ({extra})" if extra else "") + \
        " · keys: **1–5** score, **S** save (when not typing)"


def rating_summary(store: Store, message_id: Optional[int], annotator: Optional[str]) -> str:
    """One line describing the selected reply and this annotator's current rating of it."""
    if message_id is None:
        return "No reply selected yet: send a message, then click a reply to rate it."
    state = store.effective_rating(message_id, annotator) or {}
    parts = [f"Selected reply **#{message_id}**"]
    extra = alternative_text(store, message_id)
    if extra:
        parts.append(extra)
    if state.get("thumb"):
        parts.append("👍" if state["thumb"] > 0 else "👎")
    if state.get("score"):
        parts.append(f"score {state['score']}/5")
    if state.get("flags"):
        parts.append("flags: " + ", ".join(state["flags"]))
    if state.get("note"):
        parts.append("note saved")
    return " · ".join(parts)
