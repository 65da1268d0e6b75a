"""Chat & Rate tab: talk to an agent version, label its replies, regenerate, go back to earlier conversations and
alternatives.

The conversation half lives here: send, stream, regenerate, alternatives, the conversation list. Labels are the
other half (``ui.tabs.chat_labels``): each one is an immediate write addressed by the reply it was clicked on, and
the label panel only shows what the Store holds. A streaming reply never writes a label and never unlocks a button
it did not lock; a message typed while a reply streams stays in the box, and one sent then goes out when the reply
ends. The view logic lives in ``ui.tabs.chat_view``.
"""
from __future__ import annotations

import time
from typing import Optional

import gradio as gr

from ui.flows import access, chat as chatflow
from ui.permissions import Forbidden
from ui.services import Services, bind
from ui.tabs import chat_labels as labels
from ui.tabs import chat_view as cv
from ui.tabs.chat_layout import IDLE, NOTE_GATE_JS, PAGE_JS, ChatParts, layout_chat
from ui.tabs.chat_versions import (ACTIVE, follow_store, refresh_agents, refresh_versions, show_picker,
                                   version_choices)
from ui.tabs.common import (MOVED, MOVING, PAINT_SECONDS, SEND_AFTER_MOVES, check_message, guidelines_markdown,
                            labeller)
from ui.tabs.errors import error_status, error_text, handles_errors
from ui.views.text import literal_html

STREAMING = ("Generating… (labels still work on the other replies; to type your next message click the box: "
             "Enter sends it when this reply ends)")
BUSY = "A reply is being written: wait for it to end (New conversation and Regenerate come back then)."
SWITCH_BUSY = ("A reply from **{agent}** is still being written, so the agent stays {agent} for now: when it ends, "
               "pick **{picked}** again (that starts a new conversation with it).")
N_OUT = 9  # chatbot, state, text, status, conversations, and the four locked buttons: see ``ChatParts.out``
N_ALL = N_OUT + labels.N_PANEL  # what the conversation handlers update: the conversation and the label panel


def empty_state() -> dict:
    """The tab's session state: the conversation shown, its branch's message ids, and whether a reply streams."""
    return {"conversation_id": None, "ids": [], "busy": False}


# ---- building the outputs ------------------------------------------------------------------------
def _locks(enabled: bool) -> tuple:
    """Regenerate, the two alternative buttons and New conversation: off while a reply streams."""
    return tuple(gr.Button(interactive=enabled) for _ in range(4))


def _list(services: Services, agent_name: str, name: Optional[str], conversation_id: Optional[int],
          writing: bool = False):
    """The "Your conversations" dropdown, on the current one (``writing``: its reply is being written, so its last
    turn is not "unanswered")."""
    rows = services.store.list_conversations(agent_name, name) if name else []
    if writing:
        rows = [{**r, "unanswered": 0} if r["id"] == conversation_id else r for r in rows]
    choices = cv.conversation_choices(rows)
    value = conversation_id if conversation_id in [c[1] for c in choices] else None
    return gr.Dropdown(choices=choices, value=value)


def shown_view(services: Services, request, annotator, agent_name, state: dict, status: str,
               icons: bool = True) -> tuple:
    """The conversation outputs of a handler that changed what is shown (never the label panel): the state's branch
    with its thumb icons as stored for the viewer (``icons=False``: the plain messages, the public API's answer;
    ``chat_labels.follow_reply`` lights the icons after)."""
    name = labels.viewer(services, request, annotator)
    history, state["ids"] = cv.branch_view(services.store, next((i for i in reversed(state["ids"]) if i), None))
    chat = gr.Chatbot(value=history, feedback_value=labels.icons(services, request, state["ids"], name).feedback_value)
    chat = chat if icons else history
    return (chat, state, gr.skip(), status, _list(services, agent_name, name, state["conversation_id"]),
            *_locks(True))


def _lit(services: Services, request, annotator, history: list, ids: list) -> gr.Chatbot:
    """The chat as a reply starts streaming, the earlier replies' thumbs lit as stored (they stay clickable)."""
    name = labels.viewer(services, request, annotator)
    return gr.Chatbot(value=history, feedback_value=labels.icons(services, request, ids, name).feedback_value)


def _status_only(status: str, n: int = N_ALL) -> tuple:
    return (gr.skip(), gr.skip(), gr.skip(), status) + (gr.skip(),) * (n - 4)


def _refused(state: dict, status: str) -> tuple:
    """A send or regenerate that started nothing: the status says why, and no reply is left for ``follow_reply``
    (chained after it) to move the panel to."""
    return (gr.skip(), {**state, "reply": None}, gr.skip(), status) + (gr.skip(),) * (N_ALL - 4)


def _stream(pending: chatflow.PendingReply, history: list):
    """Yield outputs while the reply streams into the last bubble (only the chat changes), at most one repaint per
    ``PAINT_SECONDS`` (a browser re-renders the whole bubble each time), then store it; cancel it when the page is
    left."""
    so_far, painted = "", 0.0
    try:
        for delta in pending:
            so_far += delta
            if time.monotonic() - painted >= PAINT_SECONDS:
                history[-1]["content"] = literal_html(so_far)
                painted = time.monotonic()
                yield (history,) + (gr.skip(),) * (N_ALL - 1)
        pending.save()
    finally:
        if pending.saved is None:  # the page was left or reloaded: stop generating for nobody
            pending.stream.cancel()


# ---- handlers ------------------------------------------------------------------------------------
def _params(services: Services, agent, max_new_tokens, temperature, top_p, seed):
    return chatflow.gen_params(services.config, agent, int(max_new_tokens), float(temperature), float(top_p),
                               cv.parse_seed(seed))


def _policy_id(version) -> Optional[int]:
    """The version picked: None for "the active one" (also what annotators, who see no picker, always send)."""
    if version in (None, "", ACTIVE):
        return None
    return int(version)


def send_message(services: Services, text: str, state: dict, agent_name: str, policy_id, annotator: str,
                 max_new_tokens, temperature, top_p, seed, touched=0, form_for=None, panel_as=None, note=None,
                 shown=None, request: gr.Request = None):
    """Record the user's message, stream the reply into the chat (the label panel moves to it as it starts),
    record the reply. ``shown`` is the chat as the page shows it: when the page shows none (its trash icon emptied
    it) the message starts a new conversation, even if the trash's own event has not reached the state yet."""
    store = services.store
    state = {**empty_state(), **dict(state or {})}
    if state["busy"]:
        yield _status_only(BUSY)
        return
    if shown is not None and not shown:
        state = empty_state()
    try:
        name = labeller(services, request, annotator)
        check_message(services, text)
        agent = store.get_agent(agent_name)
        policy = chatflow.resolve_policy(store, agent, _policy_id(policy_id), access.caller_of(services, request))
        params = _params(services, agent, max_new_tokens, temperature, top_p, seed)
        parent = cv.reply_parent(store, state["ids"]) if state["conversation_id"] else None
        turn = chatflow.plan_turn(store, agent, [{"role": "user", "content": text}], state["conversation_id"],
                                  name, parent_id=parent)
        pending = chatflow.begin_turn(store, services.server_for(agent), turn, policy, params, services.replies)
        user_msg = pending.keep_turn()  # kept through a reload mid-reply (an unanswered turn)
    except Exception as exc:  # nothing started: no reply for ``follow_reply`` to move the panel to
        yield _refused(state, error_status(exc))
        return
    history, ids = cv.branch_view(store, user_msg.id)  # ends with the bubble the reply streams into
    history[-1]["content"] = ""
    state.update(conversation_id=user_msg.conversation_id, ids=ids, busy=True, reply=None,
                 touched_at_start=int(touched or 0))
    yield (_lit(services, request, annotator, history, ids), dict(state), "", STREAMING, gr.skip()) + _locks(False) + \
        labels.writing_panel(services, request, form_for, panel_as, note)
    yield from _streamed(services, request, annotator, agent_name, state, pending, history, "Reply **#{id}** stored",
                         "⚠️ The reply failed ({exc}); your message is kept: press Regenerate to answer it.")


def _streamed(services, request, annotator, agent_name, state: dict, pending, history, done: str, failed: str):
    """Stream a reply, then the final update: busy off, buttons back on, the reply's id for ``follow_reply``."""
    store = services.store
    try:
        yield from _stream(pending, history)
        reply = pending.saved
        lead = done.format(id=reply.id, n=len(store.siblings(reply.id)))
        status = cv.rating_summary(store, reply.id, labels.viewer(services, request, annotator), lead) + \
            cv.cut_hint(reply) + cv.same_text_note(store, reply.id)
        state.update(ids=[reply.id], reply=reply.id)
    except Exception as exc:  # a failed generation: the turn stays, marked unanswered; the app stays usable
        state["reply"] = None
        status = failed.format(exc=error_text(exc))
    state["busy"] = False
    yield shown_view(services, request, annotator, agent_name, state, status, icons=False) + \
        (gr.skip(),) * labels.N_PANEL


def _regeneration_target(store, state: dict, form_for) -> tuple[Optional[int], Optional[int]]:
    """(user message to answer, reply it replaces or None): the reply the label panel shows, when it is in this
    branch; else an unanswered turn at the end of the branch; else the branch's last reply."""
    if form_for is not None and int(form_for) in state["ids"]:
        return chatflow.sibling_parent(store, int(form_for)).id, int(form_for)
    open_turn = cv.unanswered_leaf(store, state["ids"])
    if open_turn is not None:
        return open_turn, None
    last = cv.last_reply(store, state["ids"])
    return (chatflow.sibling_parent(store, last).id, last) if last is not None else (None, None)


def regenerate_reply(services: Services, state: dict, policy_id, annotator: str, max_new_tokens, temperature,
                     top_p, seed, form_for=None, agent_name=None, touched=0, panel_as=None, note=None,
                     request: gr.Request = None):
    """Answer the panel's reply's message again (both replies are kept as alternatives), or answer a turn that
    never got its reply."""
    store = services.store
    state = {**empty_state(), **dict(state or {})}
    if state["busy"]:
        yield _status_only(BUSY)
        return
    try:
        labeller(services, request, annotator)
        parent_id, replaced = _regeneration_target(store, state, form_for)
        if parent_id is None:
            yield _refused(state, "Nothing to regenerate yet.")
            return
        agent = chatflow.agent_of(store, store.get_message(parent_id))
        agent_name = agent.name
        policy = chatflow.resolve_policy(store, agent, _policy_id(policy_id), access.caller_of(services, request))
        params = _params(services, agent, max_new_tokens, temperature, top_p, seed)
        pending = chatflow.begin_reply(store, services.server_for(agent), parent_id, policy, params,
                                       services.replies)
    except Exception as exc:  # nothing started: no reply for ``follow_reply`` to move the panel to
        yield _refused(state, error_status(exc))
        return
    history, ids = cv.branch_view(store, parent_id)  # ends with the bubble the reply streams into
    history[-1]["content"] = ""
    state.update(ids=ids, busy=True, reply=None, touched_at_start=int(touched or 0))
    yield (_lit(services, request, annotator, history, ids), dict(state), gr.skip(), "Regenerating…", gr.skip()) + \
        _locks(False) + \
        labels.writing_panel(services, request, form_for, panel_as, note)
    done = "Alternative {n} stored as reply **#{id}**" if replaced is not None else "Answered: reply **#{id}** stored"
    yield from _streamed(services, request, annotator, agent_name, state, pending, history, done,
                         "⚠️ The reply failed ({exc}); press Regenerate to try again.")


def _moved(services, request, annotator, agent_name, state: dict, target, status: str, panel_in: tuple) -> tuple:
    """Conversation outputs plus the label panel moved to ``target`` by the person's click."""
    name = labels.viewer(services, request, annotator)
    shown, shown_as, note, touched = panel_in
    panel, warning = labels.moved_panel(services, target, name, None if shown is None else int(shown), shown_as,
                                        note, touched, request)
    return shown_view(services, request, annotator, agent_name, state, status + warning) + panel


def show_alternative(services: Services, step: int, state: dict, agent_name, annotator, form_for, panel_as, note,
                     touched=0, request: gr.Request = None):
    """Show the previous (-1) or next (+1) alternative of the panel's reply, with the turns that followed it."""
    store = services.store
    state = {**empty_state(), **dict(state or {})}
    reply = int(form_for) if form_for is not None and int(form_for) in state["ids"] else \
        cv.last_reply(store, state["ids"])
    target = cv.step_alternative(store, reply, step) if reply is not None else None
    if target is None:
        return _status_only("No other alternative that way: Regenerate makes one.")
    _, state["ids"] = cv.branch_view(store, cv.newest_leaf(store, target))
    name = labels.viewer(services, request, annotator)
    return _moved(services, request, annotator, agent_name, state, target, cv.rating_summary(store, target, name),
                  (form_for, panel_as, note, touched))


@handles_errors(lambda status: _status_only(status), warn=False)
def open_conversation(services: Services, conversation_id, state: dict, agent_name, annotator, form_for, panel_as,
                      note, touched=0, request: gr.Request = None):
    """Show one of the annotator's conversations where it was left (its newest message)."""
    store = services.store
    state = {**empty_state(), **dict(state or {})}
    if conversation_id in (None, ""):
        return _status_only(IDLE)
    if state["busy"]:
        return _status_only(BUSY)
    name = labels.viewer(services, request, annotator)
    conv = store.get_conversation(int(conversation_id))
    if not name or conv.annotator_id != store.annotator_id(name):
        raise Forbidden("that conversation is someone else's")
    leaf = store.leaf(conv.id)
    _, ids = cv.branch_view(store, leaf.id)
    selected = leaf.id if leaf.role == "assistant" else None
    state = {**empty_state(), "conversation_id": conv.id, "ids": ids}
    status = cv.rating_summary(store, selected, name) if selected else \
        "Your last message here has no reply yet: press **Regenerate** to answer it."
    return _moved(services, request, annotator, agent_name, state, selected, status,
                  (form_for, panel_as, note, touched))


def new_conversation(services: Services, state: dict, agent_name, annotator, form_for=None, panel_as=None,
                     note=None, touched=0, request: gr.Request = None):
    """An empty chat (the old conversation stays stored and listed); refused while a reply streams."""
    if (state or {}).get("busy"):
        # the trash icon already emptied the view: show the streaming conversation again
        return _status_only(BUSY)
    return _moved(services, request, annotator, agent_name, empty_state(), None, "New conversation: say something.",
                  (form_for, panel_as, note, touched))


def switch_agent(services: Services, state: dict, agent_name, annotator, form_for=None, panel_as=None, note=None,
                 touched=0, request: gr.Request = None):
    """Another agent picked: a new conversation with it; while a reply streams, the pick goes back to the agent
    of the conversation on screen and the status says what to do."""
    state = state or {}
    if state.get("busy") and state.get("conversation_id") is not None:
        agent = chatflow.agent_of(services.store, services.store.get_message(next(i for i in state["ids"] if i)))
        if agent.name != agent_name:
            return _status_only(SWITCH_BUSY.format(agent=agent.name, picked=agent_name)) + (agent.name,)
        return _status_only(STREAMING) + (gr.skip(),)
    return new_conversation(services, state, agent_name, annotator, form_for, panel_as, note, touched, request) + \
        (gr.skip(),)


def refresh_list(services: Services, agent_name: str, annotator: str, state: dict, request: gr.Request = None):
    """The conversation list and the guidelines for the current name and agent."""
    name = labels.viewer(services, request, annotator)
    state = state or {}
    return (_list(services, agent_name, name, state.get("conversation_id"), bool(state.get("busy"))),
            guidelines_markdown(services, agent_name))


# ---- wiring ----------------------------------------------------------------------------------------
def build_chat(services: Services, annotator: gr.Textbox) -> None:
    """Lay out the tab (inside ``with gr.Tab(...)``) and bind its handlers."""
    agents = [a.name for a in services.store.list_agents()]
    choices, active = version_choices(services.store, agents[0])
    p = layout_chat(services, empty_state(), choices, active)
    _wire_replies(services, p, annotator)
    _wire_labels(services, p, annotator)
    _wire_moves(services, p, annotator)
    _wire_store(services, p, annotator)


def _wire_replies(services: Services, p: ChatParts, annotator) -> None:
    """Send and Regenerate: a reply streams (the panel moves to it as it starts), then the panel fills in."""
    follow = bind(labels.follow_reply, services)
    follow_in = [p.state, annotator] + p.panel_in
    # One event for Enter and Send; "always_last": a message sent while a reply streams goes out when it ends. The
    # box gives the focus back on send, so the keys 1-5 label the reply and do not type into the box.
    gr.on([p.text.submit, p.send.click], bind(send_message, services),
          [p.text, p.state, p.agent, p.version, annotator] + p.gen + [p.touched, p.form_for, p.panel_as, p.note,
                                                                    p.chatbot],
          p.out + p.panel_out, api_name="chat", trigger_mode="always_last", concurrency_limit=None,
          concurrency_id="generate", js=SEND_AFTER_MOVES) \
        .then(follow, follow_in, p.panel_out + [p.chatbot], api_name=False, show_progress="hidden")
    p.regen.click(bind(regenerate_reply, services), [p.state, p.version, annotator] + p.gen +
                  [p.form_for, p.agent, p.touched, p.panel_as, p.note], p.out + p.panel_out, api_name="regenerate",
                  concurrency_limit=None, concurrency_id="generate", js=SEND_AFTER_MOVES) \
        .then(follow, follow_in, p.panel_out + [p.chatbot], api_name=False, show_progress="hidden")


def _wire_labels(services: Services, p: ChatParts, annotator) -> None:
    """Label writes. Every click is queued ("multiple": a quick second click is never dropped); different people's
    run side by side (no limit), one person's one at a time in click order (``Services.labels.turn``). No progress
    veil over the panel while a label is stored (a flicker on every click); the status line answers."""
    each = {"trigger_mode": "multiple", "concurrency_limit": None, "concurrency_id": "labels",
            "show_progress": "hidden", "api_name": False}
    p.chatbot.like(bind(labels.like_reply, services), [p.state, annotator] + p.panel_in,
                   p.panel_out + [p.status, p.chatbot], **each)
    p.chatbot.select(bind(labels.select_reply, services), [p.state, annotator] + p.panel_in,
                     p.panel_out + [p.status], **each)
    written = [annotator, p.form_for, p.touched]
    p.score.select(bind(labels.label_score, services), written, p.label_out, **each)
    p.clear_score.click(bind(labels.clear_score, services), written, p.label_out, **each)
    p.flags.select(bind(labels.label_flag, services), written, p.label_out, **each)
    gr.on([p.save.click, p.note.submit], bind(labels.save_note, services), [annotator, p.form_for, p.note, p.touched],
          p.label_out, **{**each, "api_name": "note"})
    reread = [p.state, annotator] + p.panel_in
    shown = bind(labels.shown_now, services)
    gate = {"fn": None, "inputs": [p.note_read], "outputs": [p.note], "js": NOTE_GATE_JS, **each}

    def then_shown(event) -> None:
        """After a re-read: its note through the gate, then ``shown_now`` (whose note passes the gate too)."""
        event.then(**gate).then(shown, [annotator, p.form_for], p.reread_out, **each).then(**gate)

    then_shown(p.refresh.click(bind(labels.refresh_panel, services), reread, p.reread_out + [p.chatbot], **each))
    then_shown(annotator.change(bind(labels.rename, services), reread, p.reread_out + [p.chatbot], api_name=False,
                                show_progress="hidden"))
    gr.on([p.form_for.change, p.state.change], bind(labels.mark, services), [p.state, p.form_for], [p.mark],
          api_name=False, show_progress="hidden", concurrency_limit=None)
    gr.on(None, None, None, None, js=PAGE_JS, api_name=False)  # on load: the bubble outline, focus re-reads


def _wire_moves(services: Services, p: ChatParts, annotator) -> None:
    """What moves the conversation shown: alternatives, New conversation, the list, another agent."""
    moved_in = [p.state, p.agent, annotator] + p.panel_in
    for button, step in ((p.prev_alt, -1), (p.next_alt, 1)):
        button.click(bind(show_alternative, services, step), moved_in, p.out + p.panel_out, api_name=False)
    emptied = [p.new.click, p.chatbot.clear]  # a send waits until the state is reset too (common.MOVING)
    gr.on(emptied, None, None, None, js=MOVING, api_name=False)
    gr.on(emptied, bind(new_conversation, services), moved_in, p.out + p.panel_out, api_name=False) \
        .then(None, None, None, js=MOVED, api_name=False)
    p.conversations.input(bind(open_conversation, services), [p.conversations] + moved_in, p.out + p.panel_out,
                          api_name=False)
    listing = bind(refresh_list, services)
    p.agent.change(bind(refresh_versions, services), [p.agent], [p.version], api_name=False)
    p.agent.focus(bind(refresh_agents, services), [p.agent], [p.agent], api_name=False)
    p.agent.input(bind(switch_agent, services), moved_in, p.out + p.panel_out + [p.agent], api_name=False) \
        .then(listing, [p.agent, annotator, p.state], [p.conversations, p.guide], api_name=False)


def _wire_store(services: Services, p: ChatParts, annotator) -> None:
    """What an open page picks up from the Store: the conversation list, guidelines, versions, the picker."""
    listing = bind(refresh_list, services)
    gr.on([annotator.change, p.conversations.focus], listing, [p.agent, annotator, p.state], [p.conversations, p.guide],
          api_name=False, show_progress="hidden")
    gr.on(None, listing, [p.agent, annotator, p.state], [p.conversations, p.guide], api_name=False)  # on load
    gr.on(None, bind(show_picker, services), None, [p.version], api_name=False)
    gr.Timer(10).tick(bind(follow_store, services), [p.agent, p.version, p.guide], [p.version, p.guide],
                      api_name=False, show_progress="hidden")
