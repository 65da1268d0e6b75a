"""The Chat tab's labels: every label is one immediate write addressed by the reply it was clicked on.

A thumb (the reply's own 👍/👎 icon), a score, a flag and a note are each their own event, stored the moment they
are clicked under the name signed in (or typed) at that moment; clicking a lit thumb or the score's *Clear* takes it
back (an append-only withdrawal). The label panel beside the conversation only *shows* what the Store holds for one
reply, and the chat outlines that reply's bubble with its number. Its id travels with every click (``form_for``: the
panel's reply as the page showed it when the click was made), and the caller must own that reply exactly as REST
asks (``ui.flows.access.message_for``). Each page's view is remembered server-side (``Services.labels``): a click
on a view that another tab or device changed since is refused and the panel shows the Store again (it also
re-reads on focus and after every write). One person's clicks are stored one at a time in click order; different
people's side by side.

A note typed and not saved stays as that reply's draft when the panel moves away, and comes back with it. Send and
Regenerate move the panel to the reply being written (its labels open when it ends); it fills in when the reply
ends unless the person clicked in the panel since (``touched`` counts those clicks; keys never count).
"""
from __future__ import annotations

from typing import Optional

import gradio as gr

from storage import InvalidInput, Message, NotFound
from ui.flows import access
from ui.permissions import current_user
from ui.services import Services
from ui.tabs import chat_view as cv
from ui.tabs.chat_layout import KEEP_NOTE
from ui.tabs.common import labeller
from ui.tabs.errors import error_status, handles_errors

N_PANEL = 7  # form_for, panel_as, header, score, flags, note, touched: see ``panel``
NOTE_SLOT = 5
STALE = ("Reply #{reply}'s {what} changed in another tab or device after this page showed it: nothing was stored. "
         "The panel now shows what is stored; click again if you still mean it.")
WRITING_REFUSED = ("No reply in the panel to label: click a reply first (a reply being written opens its labels "
                   "when it ends).")


def viewer(services: Services, request, annotator: Optional[str]) -> Optional[str]:
    """Whose labels the page shows: the signed-in user, or the typed name (None: nobody's)."""
    if services.auth is not None:
        return current_user(services, request)
    return (annotator or "").strip() or None


def page_of(request) -> Optional[str]:
    """The page (Gradio session) a request came from: each tab of a browser is its own."""
    return getattr(request, "session_hash", None)


def owned_reply(services: Services, request, reply_id) -> Message:
    """The reply ``reply_id`` when the caller may label it, exactly as REST decides (their own conversation; admins
    and local mode: any); NotFound, as for an unknown id, for anyone else's."""
    return access.message_for(services.store, access.caller_of(services, request), int(reply_id))


def icons(services: Services, request, ids: list, name: Optional[str], pending: bool = False) -> gr.Chatbot:
    """The thumb icons of a branch as the Store holds them for ``name``, remembered as this page's view."""
    thumbs = cv.thumbs_shown(services.store, ids, name)
    replies = [i for i in ids if i is None or services.store.get_message(i).role == "assistant"]
    for reply, thumb in zip(replies, thumbs):
        services.labels.show(page_of(request), reply, name, pending, thumb={"Like": 1, "Dislike": -1}.get(thumb))
    return gr.Chatbot(feedback_value=thumbs)


def panel(services: Services, reply_id: Optional[int], name: Optional[str], keep_note: bool = False,
          touched=None, request=None, pending: bool = False) -> tuple:
    """The panel's outputs for a reply as the Store holds it for ``name``: (form_for, panel_as, header, score,
    flags, note, touched); the note box shows the page's unsaved draft for that reply when there is one
    (``keep_note``: the box is left as it is); ``touched`` (None: left as it is) counts the person's clicks on it."""
    store = services.store
    score, flags, note = cv.panel_values(store, reply_id, name)
    if not pending:  # a re-read (pending) shows the reply the panel was on; it never points the panel anywhere
        services.labels.point(page_of(request), reply_id)
    services.labels.show(page_of(request), reply_id, name, pending, score=score, flags=sorted(flags), note=note)
    draft = services.labels.draft(page_of(request), reply_id)
    live = reply_id is not None
    return (reply_id, name or "", cv.panel_header(store, reply_id, name), gr.Radio(value=score, interactive=live),
            gr.CheckboxGroup(value=flags, interactive=live),
            gr.skip() if keep_note else (draft if draft is not None else note),
            gr.skip() if touched is None else touched)


def writing_panel(services: Services, request, form_for, panel_as, note) -> tuple:
    """The panel on the reply being written (Send, Regenerate): the old reply's unsaved note kept as its draft,
    scores and flags closed (keys 1–5 do nothing) until the reply ends."""
    keep_draft(services, request, form_for, panel_as, note)
    services.labels.point(page_of(request), None)
    return (None, gr.skip(), cv.WRITING, gr.Radio(value=None, interactive=False),
            gr.CheckboxGroup(value=[], interactive=False), "", gr.skip())


def keep_draft(services: Services, request, shown, shown_as, note) -> bool:
    """Keep the note typed for the panel's reply as its draft when it is not the stored one; True when kept."""
    shown = None if shown is None else int(shown)
    if not cv.unsaved_note(services.store, shown, shown_as or None, note):
        services.labels.keep_draft(page_of(request), shown, "")
        return False
    services.labels.keep_draft(page_of(request), shown, note)
    return True


def touch(touched) -> int:
    """The click counter after one more click of the person's on the panel."""
    return int(touched or 0) + 1


def moved_panel(services: Services, target: Optional[int], name: Optional[str], shown: Optional[int],
                shown_as: Optional[str], note: Optional[str], touched=0, request=None) -> tuple[tuple, str]:
    """The panel moved to ``target`` by the person's own click, and a line saying where a note typed and not saved
    went (it stays as that reply's draft; nothing is saved on a move)."""
    warning = ""
    if shown is not None and shown != target and keep_draft(services, request, shown, shown_as, note):
        warning = f" · your unsaved note for reply #{shown} is kept as its draft (**Save note** there stores it)"
    return panel(services, target, name, touched=touch(touched), request=request), warning


def _index(data) -> int:
    return data.index if isinstance(data.index, int) else data.index[0]


def clicked_reply(services: Services, state: dict, data, request=None) -> int:
    """The id of the reply a chatbot event (like, select) was made on. The bubble's text is checked against the
    stored message, so a click on a view that changed meanwhile labels nothing (StoreError says so)."""
    ids = (state or {}).get("ids", [])
    index = _index(data)
    if not 0 <= index < len(ids):
        raise InvalidInput("That message is not part of this conversation: nothing was stored.")
    if ids[index] is None:
        raise InvalidInput("That bubble is not a stored reply yet: wait for it to finish, then label it.")
    message = owned_reply(services, request, ids[index])
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


def check_seen(services: Services, request, reply: int, name: str, field: str, stored, what: str) -> None:
    """Refuse a click made on a view of ``field`` that is no longer what the Store holds (another tab or device
    changed it after this page showed it)."""
    seen = services.labels.seen(page_of(request), reply, name)
    if seen is not None and field in seen and seen[field] != stored:
        raise InvalidInput(STALE.format(reply=reply, what=what))


def _thumb(services: Services, request, reply: int, name: str, liked) -> str:
    """Store one thumb click (or take the thumb back) when the page showed the thumb the Store holds."""
    store = services.store
    stored = (store.effective_rating(reply, name) or {}).get("thumb")
    check_seen(services, request, reply, name, "thumb", stored, "👍/👎")
    if liked is True or liked == "Like":
        store.record_rating(reply, name, thumb=1)
        return "👍 stored"
    if liked is False or liked == "Dislike":
        store.record_rating(reply, name, thumb=-1)
        return "👎 stored"
    # the lit icon clicked again: "" from the browser
    return "thumb taken back" if store.withdraw_rating(reply, name) else "no thumb of yours to take back"


def like_reply(services: Services, state: dict, annotator: str, form_for, panel_as, note, touched,
               data: gr.LikeData, request: gr.Request = None):
    """A reply's 👍/👎 icon: stored at once on that reply (a double click stores one); clicking the lit icon again
    takes the thumb back. The panel moves to that reply (a note typed for another one stays as its draft)."""
    store = services.store
    ids = (state or {}).get("ids", [])
    try:
        reply = clicked_reply(services, state, data, request)
        name = labeller(services, request, annotator)
        with services.labels.turn(name):
            done = _thumb(services, request, reply, name, data.liked)
    except Exception as exc:  # the icons go back to what is stored for this person
        status = error_status(exc)
        return (gr.skip(),) * N_PANEL + (status, icons(services, request, ids, viewer(services, request, annotator)))
    shown = None if form_for is None else int(form_for)
    outputs, warning = moved_panel(services, reply, name, shown, panel_as, note, touched, request)
    status = cv.rating_summary(store, reply, name, f"{done} on reply **#{reply}**") + \
        cv.same_text_note(store, reply) + warning
    return outputs + (status, icons(services, request, ids, name))


@handles_errors(lambda status: (gr.skip(),) * N_PANEL + (status,), warn=False)
def select_reply(services: Services, state: dict, annotator: str, form_for, panel_as, note, touched,
                 data: gr.SelectData, request: gr.Request = None):
    """Clicking a reply shows its labels in the panel (nothing is written)."""
    name = viewer(services, request, annotator)
    reply = clicked_reply(services, state, data, request)
    services.labels.point(page_of(request), reply)  # at once: a re-read already on its way must not undo the move
    shown = None if form_for is None else int(form_for)
    outputs, warning = moved_panel(services, reply, name, shown, panel_as, note, touched, request)
    return outputs + (cv.rating_summary(services.store, reply, name) + warning,)


def _label(services: Services, request, annotator, form_for, touched, write) -> tuple:
    """Store one label on the reply the panel showed at the click and show that reply's panel as now stored:
    (status, form_for, panel_as, header, score, flags, touched). A click still in flight when the panel moved
    brings the panel back to the reply it was stored on, so what the panel names is where the next click goes."""
    if form_for is None:
        return (WRITING_REFUSED,) + (gr.skip(),) * 6
    reply = int(form_for)
    try:
        owned_reply(services, request, reply)
        name = labeller(services, request, annotator)
        with services.labels.turn(name):
            done = write(services.store, reply, name)
    except Exception as exc:  # the panel goes back to what is stored for this person
        status = error_status(exc)
        name = viewer(services, request, annotator)
        reply = None if isinstance(exc, NotFound) else reply  # someone else's reply: show nothing of it
        return (status,) + panel(services, reply, name, keep_note=True, touched=touch(touched), request=request)[:5] \
            + (touch(touched),)
    status = cv.rating_summary(services.store, reply, name, f"{done} on reply **#{reply}**")
    return (status,) + panel(services, reply, name, keep_note=True, request=request)[:5] + (touch(touched),)


def label_score(services: Services, annotator: str, form_for, touched, data: gr.SelectData,
                request: gr.Request = None):
    """A score clicked (or keyed 1–5): stored at once on the panel's reply."""
    def write(store, reply, name):
        stored = (store.effective_rating(reply, name) or {}).get("score")
        check_seen(services, request, reply, name, "score", stored, "score")
        store.record_rating(reply, name, score=data.value)
        return f"Score {data.value} stored"
    return _label(services, request, annotator, form_for, touched, write)


def clear_score(services: Services, annotator: str, form_for, touched, request: gr.Request = None):
    """*Clear* under the scores: the stored score taken back (an append-only withdrawal)."""
    def write(store, reply, name):
        stored = (store.effective_rating(reply, name) or {}).get("score")
        check_seen(services, request, reply, name, "score", stored, "score")
        return "Score taken back" if store.withdraw_rating(reply, name, field="score") else "No score of yours to clear"
    return _label(services, request, annotator, form_for, touched, write)


def label_flag(services: Services, annotator: str, form_for, touched, data: gr.SelectData,
               request: gr.Request = None):
    """A flag ticked or unticked: that one flag added to or taken out of the stored set, at once."""
    def write(store, reply, name):
        stored = sorted((store.effective_rating(reply, name) or {}).get("flags") or [])
        check_seen(services, request, reply, name, "flags", stored, "flags")
        store.record_rating(reply, name, flags=cv.toggled_flags(stored, data.value, bool(data.selected)))
        return f"Flag {data.value} " + ("stored" if data.selected else "taken off")
    return _label(services, request, annotator, form_for, touched, write)


def save_note(services: Services, annotator: str, form_for, note: str, touched=0, request: gr.Request = None):
    """The note box stored on the panel's reply (an empty box clears a stored note)."""
    def write(store, reply, name):
        stored = cv.panel_values(store, reply, name)[2]
        check_seen(services, request, reply, name, "note", stored, "note")
        if (note or "").strip() == stored.strip():
            return "Nothing new in the note" if stored.strip() else "Type a note first"
        store.record_rating(reply, name, note=note or "")
        services.labels.keep_draft(page_of(request), reply, "")
        return "Note stored" if (note or "").strip() else "Note cleared"
    return _label(services, request, annotator, form_for, touched, write)


def follow_reply(services: Services, state: dict, annotator: str, form_for, panel_as, note, touched,
                 request: gr.Request = None):
    """After a reply ended: the panel, moved to it when it started, fills in (a note typed for it meanwhile stays
    in the box) unless the person clicked in the panel since (their clicks there count up ``touched``): then it
    stays where their hand is and its header says where the new reply is. The thumb icons light up as stored for
    the name in the box now. The status line is the stream's own (a quicker click's answer is never overwritten)."""
    state = state or {}
    reply = state.get("reply")
    name = viewer(services, request, annotator)
    chat = icons(services, request, state.get("ids", []), name)
    shown = None if form_for is None else int(form_for)
    if reply is None:  # the reply failed (the stream's own status says so): a panel left on it shows nothing
        return (panel(services, None, name, keep_note=True, request=request) if shown is None else
                (gr.skip(),) * N_PANEL) + (chat,)
    busy_hand = int(touched or 0) != int(state.get("touched_at_start") or 0)
    if shown is not None and shown != reply and busy_hand:
        header = cv.panel_header(services.store, shown, panel_as or None) + \
            f" · the new reply **#{reply}** is in: click it to label it (the panel stays while you label here)"
        return (gr.skip(), gr.skip(), header) + (gr.skip(),) * (N_PANEL - 3) + (chat,)
    typed = shown is None and bool((note or "").strip())  # a note typed for the reply while it was written
    return panel(services, reply, name, keep_note=typed, request=request) + (chat,)


def refresh_panel(services: Services, state: dict, annotator: str, form_for, panel_as, note, touched=0,
                  request: gr.Request = None):
    """The panel and the thumb icons read again from the Store (the page got the focus back, or another tab or
    device may have written): nothing is written, and a note being typed stays in its box. A click made before the
    page shows the re-read is judged by what it showed then (``shown_now`` follows this in the browser). When the
    panel was moved to another reply after this re-read was asked for (a click right as the page got the focus
    back), the panel is left where the click put it."""
    name = viewer(services, request, annotator)
    chat = icons(services, request, (state or {}).get("ids", []), name, pending=True)
    if form_for is None:  # nothing shown (or the reply is still being written): nothing to re-read
        return _reread((gr.skip(),) * N_PANEL) + (chat,)
    reply = int(form_for)
    if services.labels.moved_from(page_of(request), reply):  # a click moved the panel while this was on its way
        return _reread((gr.skip(),) * N_PANEL) + (chat,)
    keep = cv.unsaved_note(services.store, reply, panel_as or None, note)
    out = panel(services, reply, name, keep_note=keep, request=request, pending=True)
    moved = services.labels.moved_from(page_of(request), reply)
    return _reread((gr.skip(),) * N_PANEL if moved else out) + (chat,)


def _reread(out: tuple) -> tuple:
    """A re-read's panel for ``ChatParts.reread_out``: its note slot says KEEP_NOTE where the box is left as it is
    (the page's NOTE_GATE_JS then also keeps a note typed after the re-read was sent)."""
    note = out[NOTE_SLOT]
    keep = isinstance(note, dict) and "value" not in note  # gr.skip()
    return out[:NOTE_SLOT] + (KEEP_NOTE if keep else note,) + out[NOTE_SLOT + 1:]


def shown_now(services: Services, annotator: Optional[str] = None, form_for=None,
              request: gr.Request = None) -> tuple:
    """The page shows the panel and icons it was sent by ``refresh_panel``: later clicks are judged by them.

    A re-read and a click on another reply run side by side, and their answers can reach the page in either order:
    when the re-read's came last, it put the panel back on the reply it was read for. The page's panel (read now,
    after both) is then moved again to the reply the click pointed it at. For ``ChatParts.reread_out``: this answer
    can itself come after the click's, so its note passes the page's note gate (a note typed since is kept)."""
    page = page_of(request)
    services.labels.shown(page)
    pointed = services.labels.pointed(page)
    if pointed is None or form_for is None or int(form_for) == pointed:
        return _reread((gr.skip(),) * N_PANEL)
    return _reread(panel(services, pointed, viewer(services, request, annotator), request=request))


def rename(services: Services, state: dict, annotator: str, form_for, panel_as, note, touched=0,
           request: gr.Request = None):
    """A new name: the panel and the thumb icons show that name's stored labels (a note being typed stays in its
    box); nothing is written, and only what is clicked from now on is labelled under the new name."""
    return refresh_panel(services, state, annotator, form_for, panel_as, note, touched, request)


def mark(services: Services, state: dict, form_for, request: gr.Request = None) -> str:
    """The hidden marker of the bubble the panel labels (see ``chat_view.mark_html``): the reply the server last
    pointed the panel at, not the page's ``form_for``. A Send changes the panel's reply and the conversation in
    one update; the page may fire the marker's event for the conversation before it holds the panel's new reply,
    and two answers of this event can reach the page in either order: read from the server, both say the same."""
    state = state or {}
    shown = None if form_for is None else int(form_for)
    reply = services.labels.panel_reply(page_of(request), shown)
    return cv.mark_html(reply, state.get("ids", []), bool(state.get("busy")))
