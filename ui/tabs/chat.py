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

from storage import FLAGS
from ui.flows import access, chat as chatflow
from ui.permissions import Forbidden, is_admin
from ui.services import Services, bind
from ui.tabs import chat_labels as labels
from ui.tabs import chat_view as cv
from ui.tabs.common import BLUR_ON_SEND, PAINT_SECONDS, check_message, guidelines_markdown, labeller
from ui.tabs.errors import error_status, error_text, handles_errors
from ui.views.text import literal_html

THUMBS = ("Like", "Dislike")  # flags are ticked in the label panel: one icon state per bubble can show one thumb
ACTIVE = "active"  # the version choice that follows promotions
IDLE = "No reply selected yet: send a message, then click a reply to label it."
STREAMING = ("Generating… (labels still work on the other replies; to type your next message click the box: "
             "Enter sends it when this reply ends)")
BUSY = "A reply is being written: wait for it to end (New conversation and Regenerate come back then)."
N_OUT = 9  # chatbot, state, text, status, conversations, and the four locked buttons: see build_chat's ``out``


def empty_state() -> dict:
    """The tab's session state: the conversation shown, its branch's message ids, and whether a reply streams."""
    return {"conversation_id": None, "ids": [], "busy": False}


def version_choices(store, agent_name: str) -> tuple[list[tuple[str, object]], str]:
    """Dropdown choices: "the active version" (follows promotions), then each servable version by id (pinned)."""
    policies = [p for p in store.list_policies(agent_name) if p.status in ("active", "candidate")]
    active = store.active_policy(agent_name)
    pinned = [(f"v{p.version} only" + (" · base" if p.is_base else ""), p.id) for p in reversed(policies)]
    return [(f"Active version (now v{active.version})", ACTIVE)] + pinned, ACTIVE


# ---- building the outputs ------------------------------------------------------------------------
def _locks(enabled: bool) -> tuple:
    """Regenerate, the two alternative buttons and New conversation: off while a reply streams."""
    return tuple(gr.Button(interactive=enabled) for _ in range(4))


def _list(services: Services, agent_name: str, name: Optional[str], conversation_id: Optional[int]):
    """The "Your conversations" dropdown, on the current one."""
    rows = services.store.list_conversations(agent_name, name) if name else []
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
    chat = gr.Chatbot(value=history, feedback_value=cv.thumbs_shown(services.store, state["ids"], name)) \
        if icons else history
    return (chat, state, gr.skip(), status, _list(services, agent_name, name, state["conversation_id"]),
            *_locks(True))


def _status_only(status: str, n: int = N_OUT) -> tuple:
    return (gr.skip(), gr.skip(), gr.skip(), status) + (gr.skip(),) * (n - 4)


def _refused(state: dict, status: str) -> tuple:
    """A send or regenerate that started nothing: the status says why, and no reply is left for ``follow_reply``
    (chained after it) to move the panel to."""
    return (gr.skip(), {**state, "reply": None}, gr.skip(), status) + (gr.skip(),) * (N_OUT - 4)


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
                yield (history,) + (gr.skip(),) * (N_OUT - 1)
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
                 max_new_tokens, temperature, top_p, seed, touched=0, request: gr.Request = None):
    """Record the user's message, stream the reply into the chat, record the reply."""
    store = services.store
    state = {**empty_state(), **dict(state or {})}
    if state["busy"]:
        yield _status_only(BUSY)
        return
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
    yield (history, dict(state), "", STREAMING, gr.skip()) + _locks(False)
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
    yield shown_view(services, request, annotator, agent_name, state, status, icons=False)


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
                     top_p, seed, form_for=None, agent_name=None, touched=0, request: gr.Request = None):
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
    yield (history, dict(state), gr.skip(), "Regenerating…", gr.skip()) + _locks(False)
    done = "Alternative {n} stored as reply **#{id}**" if replaced is not None else "Answered: reply **#{id}** stored"
    yield from _streamed(services, request, annotator, agent_name, state, pending, history, done,
                         "⚠️ The reply failed ({exc}); press Regenerate to try again.")


def _moved(services, request, annotator, agent_name, state: dict, target, status: str, panel_in: tuple) -> tuple:
    """Conversation outputs plus the label panel moved to ``target`` by the person's click."""
    name = labels.viewer(services, request, annotator)
    shown, shown_as, note, touched = panel_in
    panel, warning = labels.moved_panel(services, target, name, None if shown is None else int(shown), shown_as,
                                        note, touched)
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
        return _status_only("No other alternative that way: Regenerate makes one.", N_OUT + labels.N_PANEL)
    _, state["ids"] = cv.branch_view(store, cv.newest_leaf(store, target))
    name = labels.viewer(services, request, annotator)
    return _moved(services, request, annotator, agent_name, state, target, cv.rating_summary(store, target, name),
                  (form_for, panel_as, note, touched))


@handles_errors(lambda status: _status_only(status, N_OUT + labels.N_PANEL), warn=False)
def open_conversation(services: Services, conversation_id, state: dict, agent_name, annotator, form_for, panel_as,
                      note, touched=0, request: gr.Request = None):
    """Show one of the annotator's conversations where it was left (its newest message)."""
    store = services.store
    state = {**empty_state(), **dict(state or {})}
    n = N_OUT + labels.N_PANEL
    if conversation_id in (None, ""):
        return _status_only(IDLE, n)
    if state["busy"]:
        return _status_only(BUSY, n)
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
        return _status_only(BUSY, N_OUT + labels.N_PANEL)
    return _moved(services, request, annotator, agent_name, empty_state(), None, "New conversation: say something.",
                  (form_for, panel_as, note, touched))


def refresh_versions(services: Services, agent_name: str, current=None):
    """Version dropdown for an agent (picks up versions published and promoted while the page is open): the
    "active version" choice follows a promotion; a pinned version stays pinned while it is servable."""
    choices, active = version_choices(services.store, agent_name)
    keep = current if current in [c[1] for c in choices] else active
    return gr.Dropdown(choices=choices, value=keep)


def refresh_agents(services: Services, current: str):
    """Agent dropdown with agents created since the page loaded (keeps the pick)."""
    return gr.Dropdown(choices=[a.name for a in services.store.list_agents()], value=current)


def refresh_list(services: Services, agent_name: str, annotator: str, state: dict, request: gr.Request = None):
    """The conversation list and the guidelines for the current name and agent."""
    name = labels.viewer(services, request, annotator)
    return (_list(services, agent_name, name, (state or {}).get("conversation_id")),
            guidelines_markdown(services, agent_name))


def follow_store(services: Services, agent_name: str, version, guide: str):
    """What an open page picks up from the Store on its timer: versions (and promotions) and the guidelines."""
    text = guidelines_markdown(services, agent_name)
    return refresh_versions(services, agent_name, version), (gr.skip() if text == guide else text)


def show_picker(services: Services, request: gr.Request = None):
    """The version picker is for admins (and local mode); annotators chat with the active version."""
    return gr.Dropdown(visible=is_admin(services, request))


# ---- layout ---------------------------------------------------------------------------------------
CSS = """
@media (min-width: 900px) { #chat-labels { position: sticky; top: 0.5rem; align-self: flex-start; } }
@media (max-width: 640px) { #chat-conversation { height: 55vh !important; max-height: 55vh !important; } }
"""


def build_chat(services: Services, annotator: gr.Textbox) -> None:
    """Lay out the tab (inside ``with gr.Tab(...)``) and bind its handlers."""
    store = services.store
    agents = [a.name for a in store.list_agents()]
    choices, active = version_choices(store, agents[0])
    cfg = services.config.serving
    state = gr.State(empty_state())
    with gr.Row():
        agent = gr.Dropdown(agents, value=agents[0], label="Agent", scale=1)
        version = gr.Dropdown(choices, value=active, label="Version", scale=1)
        conversations = gr.Dropdown([], value=None, label="Your conversations", scale=2,
                                    info="Pick one to go back to it (⏳ = your last message has no reply yet)")
    with gr.Accordion("Annotation guidelines", open=False):
        guide = gr.Markdown(guidelines_markdown(services, agents[0]))
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=360):
            chatbot = gr.Chatbot(feedback_options=THUMBS, height=430, label="Conversation", allow_tags=False,
                                 latex_delimiters=[], elem_id="chat-conversation",  # text is text: no $$ math
                                 placeholder="Say something: replies stream in; 👍/👎 under a reply are stored "
                                             "at once (click a lit one again to take it back).")
            status = gr.Markdown(IDLE, elem_id="chat-status")
            with gr.Row():
                # No max_length: the browser would cut a long paste without a word; the handler says what is too long.
                text = gr.Textbox(placeholder="Type a message and press Enter", show_label=False, scale=5,
                                  elem_id="chat-box", min_width=200)
                send = gr.Button("Send", variant="primary", scale=1, min_width=70)
                new = gr.Button("New conversation", scale=1, min_width=110)
        # The label panel sits beside the reply (under it on a phone), with the actions on that reply.
        with gr.Column(scale=2, min_width=300, elem_id="chat-labels"):
            form_for = gr.Number(value=None, visible=False, precision=0)  # the reply the panel shows
            panel_as = gr.Textbox(value="", visible=False)  # whose labels it shows
            touched = gr.Number(value=0, visible=False, precision=0)  # the person's clicks on it so far
            header = gr.Markdown(cv.panel_header(store, None, None))
            score = gr.Radio([1, 2, 3, 4, 5], label="Score (1–5) · stored when clicked", elem_id="chat-score",
                             interactive=True)
            flags = gr.CheckboxGroup(list(FLAGS), label="Flags · stored when ticked", elem_id="chat-flags",
                                     interactive=True)
            note = gr.Textbox(label="Note", lines=2, placeholder="Optional: what is wrong or good about it",
                              elem_id="chat-note", interactive=True)
            save = gr.Button("Save note", elem_id="chat-save-note", size="sm")
            with gr.Row():
                regen = gr.Button("Regenerate", size="sm", min_width=90)
                prev_alt = gr.Button("◀ Previous alternative", size="sm", min_width=90)
                next_alt = gr.Button("Next alternative ▶", size="sm", min_width=90)
    with gr.Accordion("Generation settings", open=False):
        with gr.Row():
            max_tokens = gr.Slider(8, 1024, value=cfg.max_new_tokens, step=8, label="Max new tokens")
            temperature = gr.Slider(0, 2, value=cfg.temperature, step=0.05, label="Temperature")
            top_p = gr.Slider(0.05, 1, value=cfg.top_p, step=0.05, label="Top-p")
            seed = gr.Textbox(value="", label="Seed (empty = random)", placeholder="random",
                              info="A fixed seed repeats the same reply")
    gen = [max_tokens, temperature, top_p, seed]
    panel_in = [form_for, panel_as, note, touched]
    panel_out = [form_for, panel_as, header, score, flags, note, touched]
    out = [chatbot, state, text, status, conversations, regen, prev_alt, next_alt, new]
    assert len(out) == N_OUT and len(panel_out) == labels.N_PANEL
    follow = bind(labels.follow_reply, services)

    # One event for Enter and Send; "always_last": a message sent while a reply streams goes out when it ends. The
    # box gives the focus back on send, so the keys 1-5 label the reply and do not type into the box.
    gr.on([text.submit, send.click], bind(send_message, services),
          [text, state, agent, version, annotator] + gen + [touched], out, api_name="chat",
          trigger_mode="always_last", concurrency_limit=None, concurrency_id="generate",
          js=BLUR_ON_SEND) \
        .then(follow, [state, annotator] + panel_in, panel_out + [chatbot], api_name=False, show_progress="hidden")
    regen.click(bind(regenerate_reply, services), [state, version, annotator] + gen + [form_for, agent, touched], out,
                api_name="regenerate", concurrency_limit=None, concurrency_id="generate") \
        .then(follow, [state, annotator] + panel_in, panel_out + [chatbot], api_name=False, show_progress="hidden")
    # Label writes: every click is queued ("multiple": a quick second click is never dropped) and they are stored
    # one at a time in click order (one queue, "labels"): a thumb and its taking back land in that order.
    # No progress veil over the panel while a label is stored (a flicker on every click); the status line answers.
    once_each = {"trigger_mode": "multiple", "concurrency_limit": 1, "concurrency_id": "labels",
                 "show_progress": "hidden"}
    chatbot.like(bind(labels.like_reply, services), [state, annotator] + panel_in, panel_out + [status, chatbot],
                 api_name=False, **once_each)
    chatbot.select(bind(labels.select_reply, services), [state, annotator] + panel_in, panel_out + [status],
                   api_name=False, show_progress="hidden")
    label_out = [status, panel_as, header, score, flags, touched]
    score.select(bind(labels.label_score, services), [annotator, form_for, touched], label_out, api_name=False,
                 **once_each)
    flags.select(bind(labels.label_flag, services), [annotator, form_for, touched], label_out, api_name=False,
                 **once_each)
    gr.on([save.click, note.submit], bind(labels.save_note, services), [annotator, form_for, note, touched], label_out,
          api_name="note", **once_each)
    for button, step in ((prev_alt, -1), (next_alt, 1)):
        button.click(bind(show_alternative, services, step), [state, agent, annotator] + panel_in,
                     out + panel_out, api_name=False)
    fresh = bind(new_conversation, services)
    gr.on([new.click, chatbot.clear], fresh, [state, agent, annotator] + panel_in, out + panel_out, api_name=False)
    conversations.input(bind(open_conversation, services), [conversations, state, agent, annotator] + panel_in,
                        out + panel_out, api_name=False)
    listing = bind(refresh_list, services)
    gr.on([annotator.change, conversations.focus], listing, [agent, annotator, state], [conversations, guide],
          api_name=False, show_progress="hidden")
    annotator.change(bind(labels.rename, services), [state, annotator] + panel_in, panel_out + [chatbot],
                     api_name=False, show_progress="hidden")
    agent.change(bind(refresh_versions, services), [agent], [version], api_name=False)
    agent.focus(bind(refresh_agents, services), [agent], [agent], api_name=False)
    agent.change(fresh, [state, agent, annotator] + panel_in, out + panel_out, api_name=False) \
        .then(listing, [agent, annotator, state], [conversations, guide], api_name=False)
    gr.on(None, listing, [agent, annotator, state], [conversations, guide], api_name=False)  # on load
    gr.on(None, bind(show_picker, services), None, [version], api_name=False)
    gr.Timer(10).tick(bind(follow_store, services), [agent, version, guide], [version, guide], api_name=False,
                      show_progress="hidden")
