"""The Chat tab's labels: every label is one immediate write addressed by the reply it was clicked on.

A thumb (the reply's own 👍/👎 icon), a score, a flag and a note are each their own event, stored the moment they
are clicked under the name signed in (or typed) at that moment; clicking a lit thumb again takes it back (an
append-only withdrawal). The label panel beside the conversation only *shows* what the Store holds for one reply:
its id travels with every click (``form_for``: the panel's hidden reply id as the page showed it), nothing
is saved when the panel moves to another reply, and nothing read before a reply streamed is written after it.
The one thing a panel can hold unsaved is a note being typed: ``Save note`` stores it. A reply that ends moves the
panel to itself only when the person has not touched the panel since asking for it (``touched`` counts their
clicks on it) and types no note there: nothing is moved away under a hand that is labelling.
"""
from __future__ import annotations

from typing import Optional

import gradio as gr

from storage import InvalidInput
from ui.permissions import current_user
from ui.services import Services
from ui.tabs import chat_view as cv
from ui.tabs.common import labeller
from ui.tabs.errors import error_status, handles_errors

N_PANEL = 7  # form_for, panel_as, header, score, flags, note, touched: see ``panel``


def viewer(services: Services, request, annotator: Optional[str]) -> Optional[str]:
    """Whose labels the page shows: the signed-in user, or the typed name (None: nobody's)."""
    if services.auth is not None:
        return current_user(services, request)
    return (annotator or "").strip() or None


def panel(services: Services, reply_id: Optional[int], name: Optional[str], keep_note: bool = False,
          touched=None) -> tuple:
    """The panel's outputs for a reply as the Store holds it for ``name``: (form_for, panel_as, header, score,
    flags, note, touched); ``keep_note`` leaves the note box as it is (a note being typed); ``touched`` (None: left
    as it is) counts the person's own clicks on the panel."""
    store = services.store
    score, flags, note = cv.panel_values(store, reply_id, name)
    return (reply_id, name or "", cv.panel_header(store, reply_id, name), score, flags,
            gr.skip() if keep_note else note, gr.skip() if touched is None else touched)


def touch(touched) -> int:
    """The click counter after one more click of the person's on the panel."""
    return int(touched or 0) + 1


def moved_panel(services: Services, target: Optional[int], name: Optional[str], shown: Optional[int],
                shown_as: Optional[str], note: Optional[str], touched=0) -> tuple[tuple, str]:
    """The panel moved to ``target`` by the person's own click, and a warning when that drops a note typed but never
    saved (nothing is saved on a move)."""
    warning = ""
    if shown is not None and shown != target and cv.unsaved_note(services.store, shown, shown_as or None, note):
        warning = f" · ⚠️ the note you typed for reply #{shown} was not saved (**Save note** stores a note)"
    return panel(services, target, name, touched=touch(touched)), warning


def _index(data) -> int:
    return data.index if isinstance(data.index, int) else data.index[0]


def clicked_reply(services: Services, state: dict, data) -> int:
    """The id of the reply a chatbot event (like, select) was made on. The bubble's text is checked against the
    stored message, so a click on a view that changed meanwhile labels nothing (StoreError says so)."""
    ids = (state or {}).get("ids", [])
    index = _index(data)
    if not 0 <= index < len(ids):
        raise InvalidInput("That message is not part of this conversation: nothing was stored.")
    if ids[index] is None:
        raise InvalidInput("That bubble is not a stored reply yet: wait for it to finish, then label it.")
    message = services.store.get_message(ids[index])
    if message.role != "assistant":
        raise InvalidInput("That is your own message: only replies carry labels.")
    value = data.value
    if isinstance(value, list):  # parts, [{"type": "text", "text": ...}] or one string per grouped message
        value = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in value)
    if isinstance(value, dict):
        value = value.get("text", "")
    if isinstance(value, str) and value.split() and value.split() != cv.shown(message)["content"].split():
        raise InvalidInput("The conversation changed while you clicked: nothing was stored; click the reply again.")
    return message.id


def like_reply(services: Services, state: dict, annotator: str, form_for, panel_as, note, touched,
               data: gr.LikeData, request: gr.Request = None):
    """A reply's 👍/👎 icon: stored at once on that reply (a double click stores one); clicking the lit icon again
    takes the thumb back. The panel moves to that reply (unless a note typed for another one is unsaved)."""
    store = services.store
    try:
        reply = clicked_reply(services, state, data)
        name = labeller(services, request, annotator)
        if data.liked is True or data.liked == "Like":
            store.record_rating(reply, name, thumb=1)
            done = "👍 stored"
        elif data.liked is False or data.liked == "Dislike":
            store.record_rating(reply, name, thumb=-1)
            done = "👎 stored"
        else:  # the lit icon clicked again: "" from the browser
            done = "thumb taken back" if store.withdraw_rating(reply, name) else "no thumb of yours to take back"
    except Exception as exc:  # the icons go back to what is stored for this person
        status = error_status(exc)
        name = viewer(services, request, annotator)
        thumbs = cv.thumbs_shown(store, (state or {}).get("ids", []), name)
        return (gr.skip(),) * N_PANEL + (status, gr.Chatbot(feedback_value=thumbs))
    shown = None if form_for is None else int(form_for)
    keep = shown is not None and shown != reply and cv.unsaved_note(store, shown, panel_as or None, note)
    status = cv.rating_summary(store, reply, name, f"{done} on reply **#{reply}**") + cv.same_text_note(store, reply)
    if keep:
        status += f" · the panel stays on reply #{shown}: your note there is not saved yet"
    outputs = (gr.skip(),) * (N_PANEL - 1) + (touch(touched),) if keep else \
        panel(services, reply, name, touched=touch(touched))
    return outputs + (status, gr.skip())


@handles_errors(lambda status: (gr.skip(),) * N_PANEL + (status,), warn=False)
def select_reply(services: Services, state: dict, annotator: str, form_for, panel_as, note, touched,
                 data: gr.SelectData, request: gr.Request = None):
    """Clicking a reply shows its labels in the panel (nothing is written)."""
    name = viewer(services, request, annotator)
    reply = clicked_reply(services, state, data)
    shown = None if form_for is None else int(form_for)
    outputs, warning = moved_panel(services, reply, name, shown, panel_as, note, touched)
    return outputs + (cv.rating_summary(services.store, reply, name) + warning,)


def _label(services: Services, request, annotator, form_for, touched, write) -> tuple:
    """Store one label on the panel's reply and show the panel's score and flags as now stored: (status, panel_as,
    header, score, flags, touched)."""
    store = services.store
    if form_for is None:
        return ("Click a reply first: labels go to the reply shown in the panel.",) + (gr.skip(),) * 5
    reply = int(form_for)
    try:
        name = labeller(services, request, annotator)
        done = write(store, reply, name)
    except Exception as exc:  # the panel goes back to what is stored for this person
        status = error_status(exc)
        name = viewer(services, request, annotator)
        score, flags, _ = cv.panel_values(store, reply, name)
        return (status, gr.skip(), gr.skip(), score, flags, touch(touched))
    score, flags, _ = cv.panel_values(store, reply, name)
    return (cv.rating_summary(store, reply, name, f"{done} on reply **#{reply}**"), name,
            cv.panel_header(store, reply, name), score, flags, touch(touched))


def label_score(services: Services, annotator: str, form_for, touched, data: gr.SelectData,
                request: gr.Request = None):
    """A score clicked (or keyed 1–5): stored at once on the panel's reply."""
    def write(store, reply, name):
        store.record_rating(reply, name, score=data.value)
        return f"Score {data.value} stored"
    return _label(services, request, annotator, form_for, touched, write)


def label_flag(services: Services, annotator: str, form_for, touched, data: gr.SelectData,
               request: gr.Request = None):
    """A flag ticked or unticked: that one flag added to or taken out of the stored set, at once."""
    def write(store, reply, name):
        stored = (store.effective_rating(reply, name) or {}).get("flags")
        store.record_rating(reply, name, flags=cv.toggled_flags(stored, data.value, bool(data.selected)))
        return f"Flag {data.value} " + ("stored" if data.selected else "taken off")
    return _label(services, request, annotator, form_for, touched, write)


def save_note(services: Services, annotator: str, form_for, note: str, touched=0, request: gr.Request = None):
    """The note box stored on the panel's reply (an empty box clears a stored note)."""
    def write(store, reply, name):
        stored = cv.panel_values(store, reply, name)[2]
        if (note or "").strip() == stored.strip():
            return "Nothing new in the note" if stored.strip() else "Type a note first"
        store.record_rating(reply, name, note=note or "")
        return "Note stored" if (note or "").strip() else "Note cleared"
    return _label(services, request, annotator, form_for, touched, write)


def follow_reply(services: Services, state: dict, annotator: str, form_for, panel_as, note, touched,
                 request: gr.Request = None):
    """After a reply ended: the panel moves to it unless the person touched the panel since asking for the reply
    (their clicks there count up ``touched``) or types a note there; then it stays where their hand is and its
    header says where the new reply is. The thumb icons light up as stored for the name in the box now. The status
    line is the stream's own (a quicker click's answer is never overwritten from here)."""
    state = state or {}
    reply = state.get("reply")
    if reply is None:  # the reply failed: the stream's own status says so
        return (gr.skip(),) * (N_PANEL + 1)
    store = services.store
    name = viewer(services, request, annotator)
    icons = gr.Chatbot(feedback_value=cv.thumbs_shown(store, state.get("ids", []), name))
    shown = None if form_for is None else int(form_for)
    busy_hand = int(touched or 0) != int(state.get("touched_at_start") or 0) or \
        cv.unsaved_note(store, shown, panel_as or None, note)
    if shown is not None and shown != reply and busy_hand:
        header = cv.panel_header(store, shown, panel_as or None) + \
            f" · the new reply **#{reply}** is in: click it to label it (the panel stays while you label here)"
        return (gr.skip(), gr.skip(), header) + (gr.skip(),) * (N_PANEL - 3) + (icons,)
    return panel(services, reply, name) + (icons,)


def rename(services: Services, state: dict, annotator: str, form_for, panel_as, note, touched=0,
           request: gr.Request = None):
    """A new name: the panel and the thumb icons show that name's stored labels (a note being typed stays in its
    box); nothing is written, and only what is clicked from now on is labelled under the new name."""
    store = services.store
    name = viewer(services, request, annotator)
    thumbs = gr.Chatbot(feedback_value=cv.thumbs_shown(store, (state or {}).get("ids", []), name))
    if form_for is None:  # nothing shown: nothing to re-read (and a reply arriving meanwhile keeps its panel)
        return (gr.skip(),) * N_PANEL + (thumbs,)
    reply = int(form_for)
    keep = cv.unsaved_note(store, reply, panel_as or None, note)
    return panel(services, reply, name, keep_note=keep) + (thumbs,)
