"""View logic of the Chat & Rate tab: the branch shown, its marks, the conversation list and the rating form.

Plain functions over the Store (no Gradio), tested without a browser. The conversation is a tree: a branch is
the path from the first message down to one message; regenerated replies are siblings ("alternatives").
"""
from __future__ import annotations

import re
from typing import Optional

from storage import InvalidInput, Message, Store
from ui.flows.chat import is_cut
from ui.views.text import literal_html, short_time

UNANSWERED = ("⏳ *No reply yet: the page was left (or the reply failed) while it was being written. "
              "Press **Regenerate** to answer it.*")
TITLE_CHARS = 48


def cut_hint(reply: Message) -> str:
    """What the status line adds under a reply that stopped at its token limit."""
    return " · ✂️ cut at its token limit: raise *Max new tokens* under Generation settings for longer replies" \
        if is_cut(reply) else ""


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


# ---- the label panel ----------------------------------------------------------------------------------
# On a touch screen there are no keys to press: the hint hides there (``.rlhf-keys`` in the tab's CSS).
KEYS_HINT = '<span class="rlhf-keys"> · keys <b>1–5</b> score it when you are not typing</span>'
WRITING = ("**Labels of the new reply** (being written) · they open when it ends; click an earlier reply to label "
           "that one meanwhile")


def thumbs_shown(store: Store, ids: list, annotator: Optional[str]) -> list[Optional[str]]:
    """The chatbot's thumb icons for a branch (one entry per assistant bubble): what the Store holds for this
    annotator, so a reload, another conversation or another name never shows a thumb that is not stored."""
    out = []
    for message_id in ids:
        if message_id is None:  # the streaming bubble, or the placeholder of an unanswered turn
            out.append(None)
            continue
        if store.get_message(message_id).role != "assistant":
            continue
        thumb = (store.effective_rating(message_id, annotator) or {}).get("thumb") if annotator else None
        out.append({1: "Like", -1: "Dislike"}.get(thumb))
    return out


def panel_values(store: Store, reply_id: Optional[int], annotator: Optional[str]) -> tuple:
    """(score, flags, note) the label panel shows for a reply: the annotator's labels as stored, empty when none."""
    rating = (store.effective_rating(reply_id, annotator) if reply_id is not None and annotator else None) or {}
    return rating.get("score"), list(rating.get("flags") or []), rating.get("note") or ""


def panel_header(store: Store, reply_id: Optional[int], annotator: Optional[str]) -> str:
    """The line over the label panel: which reply it labels, and under whose name."""
    if reply_id is None:
        return "**Labels** · click a reply in the conversation to label it."
    extra = alternative_text(store, reply_id)
    who = f" as **{annotator}**" if annotator else " (type your name at the top first)"
    return f"**Labels of reply #{reply_id}**" + (f" ({extra})" if extra else "") + who + KEYS_HINT


def mark_html(reply_id: Optional[int], ids: list, writing: bool = False) -> str:
    """The hidden marker the page's script reads to outline the bubble the panel labels and show its number: the
    bubble of ``reply_id`` in the shown branch, or the reply being written (the last bubble) while ``writing``."""
    if reply_id is not None and int(reply_id) in ids:
        index, label = ids.index(int(reply_id)), f"labelling reply #{int(reply_id)}"
    elif reply_id is None and writing and ids and ids[-1] is None:
        index, label = len(ids) - 1, "labelling the new reply (being written)"
    else:
        return '<span data-index="-1"></span>'
    return f'<span data-index="{index}" data-label="{label}"></span>'


def unsaved_note(store: Store, reply_id: Optional[int], annotator: Optional[str], note: Optional[str]) -> bool:
    """True when the note box holds text that is not the stored note of the reply the panel shows."""
    if reply_id is None or not (note or "").strip():
        return False
    return (note or "").strip() != panel_values(store, reply_id, annotator)[2].strip()


def toggled_flags(stored: Optional[list], flag: str, ticked: bool) -> list[str]:
    """The flags after one checkbox click: the stored set with that one flag added or taken out."""
    flags = set(stored or [])
    (flags.add if ticked else flags.discard)(flag)
    return sorted(flags)


def parse_seed(text) -> Optional[int]:
    """The seed box: empty means a random seed (None); anything else must be a whole number."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    if isinstance(text, bool):
        raise InvalidInput(f"Seed must be a whole number or empty (random), got {text!r}")
    if isinstance(text, (int, float)):
        if isinstance(text, float) and not text.is_integer():
            raise InvalidInput(f"Seed must be a whole number or empty (random), got {text!r}")
        return int(text)
    if not re.fullmatch(r"\s*-?\d{1,18}\s*", str(text)):
        raise InvalidInput(f"Seed must be a whole number or empty (random), got {str(text)[:40]!r}")
    return int(text)


def same_text_note(store: Store, reply_id: int) -> str:
    """A status addition when a reply says word for word what an alternative of it says (no preference pair)."""
    reply = store.get_message(reply_id)
    twins = [i + 1 for i, m in enumerate(store.siblings(reply_id))
             if m.id != reply_id and m.content.split() == reply.content.split()]
    if not twins:
        return ""
    which = ", ".join(str(n) for n in twins)
    return (f" · ⚠️ word for word the same text as alternative {which}: thumbs on these never make a preference "
            "pair (a fixed seed repeats a reply; leave Seed empty for a new one)")


def rating_summary(store: Store, message_id: Optional[int], annotator: Optional[str],
                   lead: Optional[str] = None) -> str:
    """One line describing a reply and this annotator's current labels on it (``lead`` replaces "Reply #N")."""
    if message_id is None:
        return "No reply selected yet: send a message, then click a reply to label it."
    state = (store.effective_rating(message_id, annotator) if annotator else None) or {}
    parts = [lead or f"Reply **#{message_id}**"]
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
