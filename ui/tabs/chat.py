"""Chat & Rate tab: talk to an agent version, rate replies (thumbs, flags, score, note), regenerate, go back to
earlier conversations and alternatives.

No label lands on the wrong reply and no input is lost: the rating form always belongs to one reply
(``form_for``) and shows that reply's stored rating; switching to another reply first saves the form's unsaved
changes to the reply they were made on. A message typed while a reply streams stays in the box, and one sent
then goes out when the reply ends. The view logic lives in ``ui.tabs.chat_view``.
"""
from __future__ import annotations

import time
from typing import Optional

import gradio as gr

from rlhf.serving.server import Busy
from storage import FLAGS, StoreError
from ui.flows import access, chat as chatflow
from ui.permissions import Forbidden, current_user
from ui.services import Services, bind
from ui.tabs import chat_view as cv
from ui.tabs.common import PAINT_SECONDS, check_message, guidelines_markdown, labeller
from ui.views import literal_html

FEEDBACK_OPTIONS = ("Like", "Dislike") + FLAGS
IDLE = "No reply selected yet: send a message, then click a reply to rate it."
STREAMING = "Generating… (type your next message meanwhile: pressing Enter sends it when this reply ends)"
N_OUT = 14  # outputs of every handler below except save_rating: see build_chat's ``out``


def empty_state() -> dict:
    return {"conversation_id": None, "ids": [], "selected": None}


def version_choices(store, agent_name: str) -> tuple[list[tuple[str, int]], Optional[int]]:
    """Dropdown choices (label, policy id) of an agent's servable versions, and the active one."""
    policies = [p for p in store.list_policies(agent_name) if p.status in ("active", "candidate")]
    choices = [(f"v{p.version}" + (" (active)" if p.status == "active" else "") +
                (" · base" if p.is_base else ""), p.id) for p in reversed(policies)]
    return choices, store.active_policy(agent_name).id


def cut_hint(reply) -> str:
    """What the status line adds under a reply that stopped at its token limit."""
    return " · ✂️ cut at its token limit: raise *Max new tokens* under Generation settings for longer replies" \
        if chatflow.is_cut(reply) else ""


def _viewer(services: Services, request, annotator: Optional[str]) -> Optional[str]:
    """Whose ratings the form shows: the signed-in user, or the typed name (None: nobody's)."""
    if services.auth is not None:
        return current_user(services, request)
    return (annotator or "").strip() or None


# ---- building the outputs ------------------------------------------------------------------------
def _locks(enabled: bool) -> tuple:
    """Regenerate, the two alternative buttons and New conversation: off while a reply streams."""
    return tuple(gr.Button(interactive=enabled) for _ in range(4))


def _form(services: Services, name: Optional[str], target: Optional[int], form_in: tuple) -> tuple[tuple, str]:
    """The form's outputs (form_for, score, flags, note, header) for ``target``, and a notice. Unsaved changes
    the form holds for another reply are saved to that reply first: they are never moved or dropped."""
    store = services.store
    form_for, score, flags, note = form_in
    notice = ""
    if name and form_for is not None and form_for != target:
        changes = cv.form_changes(store.effective_rating(form_for, name), score, flags, note)
        if changes:
            try:
                store.record_rating(form_for, name, **changes)
                notice = f" · your unsaved rating of reply #{form_for} was saved"
            except StoreError as exc:
                notice = f" · ⚠️ your unsaved rating of reply #{form_for} was not saved: {exc}"
    stored = store.effective_rating(target, name) if (target is not None and name) else None
    if target is not None and target == form_for:  # the same reply: keep what is being typed, add new flags
        values = (gr.skip(), sorted(set(flags or []) | set(cv.form_values(stored)[1])), gr.skip())
    else:
        values = cv.form_values(stored)
    return (target, *values, cv.form_header(store, target)), notice


def _list(services: Services, agent_name: str, name: Optional[str], conversation_id: Optional[int]):
    """The "Your conversations" dropdown, on the current one."""
    rows = services.store.list_conversations(agent_name, name) if name else []
    choices = cv.conversation_choices(rows)
    value = conversation_id if conversation_id in [c[1] for c in choices] else None
    return gr.Dropdown(choices=choices, value=value)


def settled(services: Services, request, annotator, agent_name, state: dict, form_in: tuple, status: str,
            history=None, text=None) -> tuple:
    """Every output of a handler that changed what is shown: chat, state, box, status, form, list, buttons."""
    name = _viewer(services, request, annotator)
    if history is None:
        history, state["ids"] = cv.branch_view(services.store, next((i for i in reversed(state["ids"]) if i), None))
    form, notice = _form(services, name, state["selected"], form_in)
    return (history, state, gr.skip() if text is None else text, status + notice, *form,
            _list(services, agent_name, name, state["conversation_id"]), *_locks(True))


def _status_only(status: str) -> tuple:
    return (gr.skip(), gr.skip(), gr.skip(), status) + (gr.skip(),) * (N_OUT - 4)


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
    seed = None if seed in (None, "") else int(seed)
    return chatflow.gen_params(services.config, agent, int(max_new_tokens), float(temperature), float(top_p), seed)


def send_message(services: Services, text: str, state: dict, agent_name: str, policy_id, annotator: str,
                 max_new_tokens, temperature, top_p, seed, form_for=None, score=None, flags=None, note=None,
                 request: gr.Request = None):
    """Record the user's message, stream the reply into the chat, record the reply."""
    store = services.store
    state = dict(state or empty_state())
    form_in = (form_for, score, flags, note)
    try:
        name = labeller(services, request, annotator)
        check_message(services, text)
        agent = store.get_agent(agent_name)
        policy = chatflow.resolve_policy(store, agent, int(policy_id) if policy_id is not None else None,
                                         access.caller_of(services, request))
        params = _params(services, agent, max_new_tokens, temperature, top_p, seed)
        server = services.server_for(agent)
        parent = cv.reply_parent(store, state["ids"]) if state["conversation_id"] else None
        user_msg = chatflow.add_user_turn(store, agent, [{"role": "user", "content": text}],
                                          state["conversation_id"], name, parent_id=parent)
        pending = chatflow.begin_reply(store, server, user_msg.id, policy, params, services.replies)
    except (StoreError, Busy, Forbidden) as exc:
        gr.Warning(str(exc))
        yield _status_only(f"⚠️ {exc}")
        return
    history, ids = cv.branch_view(store, user_msg.id)  # ends with the bubble the reply streams into
    history[-1]["content"] = ""
    state.update(conversation_id=user_msg.conversation_id, ids=ids)
    yield (history, dict(state), "", STREAMING) + (gr.skip(),) * 6 + _locks(False)
    try:
        yield from _stream(pending, history)
        state.update(ids=[pending.saved.id], selected=pending.saved.id)
        status = cv.rating_summary(store, pending.saved.id, name) + cut_hint(pending.saved)
    except Exception as exc:  # a failed generation: the turn stays, marked unanswered; the app stays usable
        state["selected"] = None
        status = f"⚠️ The reply failed ({exc}); your message is kept: press Regenerate to answer it."
    yield settled(services, request, annotator, agent_name, state, form_in, status)


def _regeneration_target(store, state: dict) -> tuple[Optional[int], Optional[int]]:
    """(user message to answer, reply it replaces or None): the selected reply; else an unanswered turn at the
    end of the branch; else the branch's last reply."""
    selected = state.get("selected")
    if selected is not None:
        return chatflow.sibling_parent(store, selected).id, selected
    open_turn = cv.unanswered_leaf(store, state["ids"])
    if open_turn is not None:
        return open_turn, None
    last = cv.last_reply(store, state["ids"])
    return (chatflow.sibling_parent(store, last).id, last) if last is not None else (None, None)


def regenerate_reply(services: Services, state: dict, policy_id, annotator: str, max_new_tokens, temperature,
                     top_p, seed, form_for=None, score=None, flags=None, note=None, agent_name=None,
                     request: gr.Request = None):
    """Answer the selected reply's message again (both replies are kept as alternatives), or answer a turn
    that never got its reply."""
    store = services.store
    state = dict(state or empty_state())
    form_in = (form_for, score, flags, note)
    try:
        name = labeller(services, request, annotator)
        parent_id, replaced = _regeneration_target(store, state)
        if parent_id is None:
            yield _status_only("Nothing to regenerate yet.")
            return
        agent = chatflow.agent_of(store, store.get_message(parent_id))
        agent_name = agent.name
        policy = chatflow.resolve_policy(store, agent, int(policy_id) if policy_id is not None else None,
                                         access.caller_of(services, request))
        params = _params(services, agent, max_new_tokens, temperature, top_p, seed)
        pending = chatflow.begin_reply(store, services.server_for(agent), parent_id, policy, params,
                                       services.replies)
    except (StoreError, Busy, Forbidden) as exc:
        gr.Warning(str(exc))
        yield _status_only(f"⚠️ {exc}")
        return
    history, _ = cv.branch_view(store, parent_id)  # ends with the bubble the reply streams into
    history[-1]["content"] = ""
    yield (history, gr.skip(), gr.skip(), "Regenerating…") + (gr.skip(),) * 6 + _locks(False)
    try:
        yield from _stream(pending, history)
        reply = pending.saved
        state.update(ids=[reply.id], selected=reply.id)
        n = len(store.siblings(reply.id))
        status = (f"Alternative {n} stored. " if replaced is not None else "Answered. ") + \
            cv.rating_summary(store, reply.id, name) + cut_hint(reply)
    except Exception as exc:
        state["selected"] = None
        status = f"⚠️ The reply failed ({exc}); press Regenerate to try again."
    yield settled(services, request, annotator, agent_name, state, form_in, status)


def _index(data) -> int:
    return data.index if isinstance(data.index, int) else data.index[0]


def like_reply(services: Services, state: dict, annotator: str, form_for, score, flags, note, agent_name,
               data: gr.LikeData, request: gr.Request = None):
    """Thumbs and flags from the chatbot's feedback icons, stored at once (a double click stores one)."""
    store = services.store
    ids = (state or {}).get("ids", [])
    index = _index(data)
    if not 0 <= index < len(ids) or ids[index] is None:
        return _status_only("That message is not part of this conversation.")
    message_id = ids[index]
    try:
        name = labeller(services, request, annotator)
        if data.liked is True or data.liked == "Like":
            store.record_rating(message_id, name, thumb=1)
        elif data.liked is False or data.liked == "Dislike":
            store.record_rating(message_id, name, thumb=-1)
        elif isinstance(data.liked, str) and data.liked in FLAGS:
            current = store.effective_rating(message_id, name) or {}
            store.record_rating(message_id, name, flags=sorted(set(current.get("flags") or []) | {data.liked}))
        else:
            return _status_only("Feedback cleared in the view; stored feedback is kept (it is append-only).")
    except (StoreError, Forbidden) as exc:
        gr.Warning(str(exc))
        return _status_only(f"⚠️ {exc}")
    state = dict(state, selected=message_id)
    return settled(services, request, annotator, agent_name, state, (form_for, score, flags, note),
                   cv.rating_summary(store, message_id, name), history=gr.skip())


def select_reply(services: Services, state: dict, annotator: str, form_for, score, flags, note, agent_name,
                 data: gr.SelectData, request: gr.Request = None):
    """Clicking a reply selects it: the form shows (and saves) that reply's rating."""
    store = services.store
    ids = (state or {}).get("ids", [])
    index = _index(data)
    if not 0 <= index < len(ids) or ids[index] is None or store.get_message(ids[index]).role != "assistant":
        return _status_only("Select a reply (an assistant message) to rate it.")
    state = dict(state, selected=ids[index])
    status = cv.rating_summary(store, ids[index], _viewer(services, request, annotator))
    return settled(services, request, annotator, agent_name, state, (form_for, score, flags, note), status,
                   history=gr.skip())


def show_alternative(services: Services, step: int, state: dict, agent_name, annotator, form_for, score, flags,
                     note, request: gr.Request = None):
    """Show the previous (-1) or next (+1) alternative of the selected reply, with the turns that followed it."""
    store = services.store
    state = dict(state or empty_state())
    reply = state.get("selected") or cv.last_reply(store, state["ids"])
    target = cv.step_alternative(store, reply, step) if reply is not None else None
    if target is None:
        return _status_only("No other alternative that way: Regenerate makes one.")
    _, state["ids"] = cv.branch_view(store, cv.newest_leaf(store, target))
    state["selected"] = target
    return settled(services, request, annotator, agent_name, state, (form_for, score, flags, note),
                   cv.rating_summary(store, target, _viewer(services, request, annotator)))


def open_conversation(services: Services, conversation_id, state: dict, agent_name, annotator, form_for, score,
                      flags, note, request: gr.Request = None):
    """Show one of the annotator's conversations where it was left (its newest message)."""
    store = services.store
    if conversation_id in (None, ""):
        return _status_only(IDLE)
    name = _viewer(services, request, annotator)
    try:
        conv = store.get_conversation(int(conversation_id))
        if not name or conv.annotator_id != store.annotator_id(name):
            raise Forbidden("that conversation is someone else's")
        leaf = store.leaf(conv.id)
    except (StoreError, Forbidden) as exc:
        return _status_only(f"⚠️ {exc}")
    _, ids = cv.branch_view(store, leaf.id)
    selected = leaf.id if leaf.role == "assistant" else None
    state = {"conversation_id": conv.id, "ids": ids, "selected": selected}
    status = cv.rating_summary(store, selected, name) if selected else \
        "Your last message here has no reply yet: press **Regenerate** to answer it."
    return settled(services, request, annotator, agent_name, state, (form_for, score, flags, note), status)


def new_conversation(services: Services, state: dict, agent_name, annotator, form_for=None, score=None, flags=None,
                     note=None, request: gr.Request = None):
    """An empty chat (the old conversation stays stored and listed)."""
    return settled(services, request, annotator, agent_name, empty_state(), (form_for, score, flags, note),
                   "New conversation: say something.")


def save_rating(services: Services, state: dict, annotator: str, score, flags, note: str, form_for=None,
                request: gr.Request = None):
    """Store what the form says (score, flags, note) for the reply the form belongs to."""
    store = services.store
    target = form_for if form_for is not None else (state or {}).get("selected")
    if target is None:
        return "Select a reply first."
    try:
        name = labeller(services, request, annotator)
        changes = cv.form_changes(store.effective_rating(target, name), score, flags, note)
        if not changes:
            if score in (None, "") and not flags and not (note or "").strip():
                return "Choose a score, a flag or write a note first."
            return "Nothing new to save. " + cv.rating_summary(store, target, name)
        store.record_rating(target, name, **changes)
    except (StoreError, Forbidden) as exc:
        gr.Warning(str(exc))
        return f"⚠️ {exc}"
    return "Saved. " + cv.rating_summary(store, target, name)


def refresh_versions(services: Services, agent_name: str, current=None):
    """Version dropdown for an agent (picks up versions published while the app runs), keeping the pick."""
    choices, active = version_choices(services.store, agent_name)
    keep = current if current in [c[1] for c in choices] else active
    return gr.Dropdown(choices=choices, value=keep)


def refresh_agents(services: Services, current: str):
    """Agent dropdown with agents created since the page loaded (keeps the pick)."""
    return gr.Dropdown(choices=[a.name for a in services.store.list_agents()], value=current)


def refresh_list(services: Services, agent_name: str, annotator: str, state: dict, request: gr.Request = None):
    """The conversation list and the guidelines for the current name and agent."""
    name = _viewer(services, request, annotator)
    return (_list(services, agent_name, name, (state or {}).get("conversation_id")),
            guidelines_markdown(services, agent_name))


# ---- layout ---------------------------------------------------------------------------------------
def build_chat(services: Services, annotator: gr.Textbox) -> None:
    """Lay out the tab (inside ``with gr.Tab(...)``) and bind its handlers."""
    store = services.store
    agents = [a.name for a in store.list_agents()]
    choices, active = version_choices(store, agents[0])
    cfg = services.config.serving
    state, form_for = gr.State(empty_state()), gr.State(None)
    with gr.Row():
        agent = gr.Dropdown(agents, value=agents[0], label="Agent", scale=1)
        version = gr.Dropdown(choices, value=active, label="Version", scale=1)
        conversations = gr.Dropdown([], value=None, label="Your conversations", scale=2,
                                    info="Pick one to go back to it (⏳ = your last message has no reply yet)")
    with gr.Accordion("Annotation guidelines", open=False):
        guide = gr.Markdown(guidelines_markdown(services, agents[0]))
    chatbot = gr.Chatbot(feedback_options=FEEDBACK_OPTIONS, height=420, label="Conversation", allow_tags=False,
                         latex_delimiters=[], elem_id="chat-conversation",  # text is text: no $$ math
                         placeholder="Say something: replies stream in, and every rating is stored at once.")
    with gr.Row():
        # No max_length: the browser would cut a long paste without a word; the handler says what is too long.
        text = gr.Textbox(placeholder="Type a message and press Enter", show_label=False, scale=5)
        send = gr.Button("Send", variant="primary", scale=1)
    with gr.Row():
        regen = gr.Button("Regenerate")
        prev_alt = gr.Button("◀ Previous alternative")
        next_alt = gr.Button("Next alternative ▶")
        new = gr.Button("New conversation")
    status = gr.Markdown(IDLE)
    with gr.Accordion("Rate the selected reply", open=True):
        header = gr.Markdown(cv.form_header(store, None))
        with gr.Row():
            score = gr.Radio([1, 2, 3, 4, 5], label="Score (1–5)", scale=2, elem_id="chat-score")
            flags = gr.CheckboxGroup(list(FLAGS), label="Flags", scale=3)
        note = gr.Textbox(label="Note", lines=2)
        save = gr.Button("Save rating", elem_id="chat-save")
    with gr.Accordion("Generation settings", open=False):
        with gr.Row():
            max_tokens = gr.Slider(8, 1024, value=cfg.max_new_tokens, step=8, label="Max new tokens")
            temperature = gr.Slider(0, 2, value=cfg.temperature, step=0.05, label="Temperature")
            top_p = gr.Slider(0.05, 1, value=cfg.top_p, step=0.05, label="Top-p")
            seed = gr.Number(value=None, precision=0, label="Seed (empty = random)")
    gen = [max_tokens, temperature, top_p, seed]
    form_in = [form_for, score, flags, note]
    out = [chatbot, state, text, status, form_for, score, flags, note, header, conversations,
           regen, prev_alt, next_alt, new]
    assert len(out) == N_OUT

    # One event for Enter and Send; "always_last": a message sent while a reply streams goes out when it ends.
    gr.on([text.submit, send.click], bind(send_message, services),
          [text, state, agent, version, annotator] + gen + form_in, out, api_name="chat",
          trigger_mode="always_last", concurrency_limit=None, concurrency_id="generate")
    regen.click(bind(regenerate_reply, services), [state, version, annotator] + gen + form_in + [agent], out,
                api_name="regenerate", concurrency_limit=None, concurrency_id="generate")
    chatbot.like(bind(like_reply, services), [state, annotator] + form_in + [agent], out, api_name=False)
    chatbot.select(bind(select_reply, services), [state, annotator] + form_in + [agent], out, api_name=False)
    save.click(bind(save_rating, services), [state, annotator, score, flags, note, form_for], [status],
               api_name="rate")
    for button, step in ((prev_alt, -1), (next_alt, 1)):
        button.click(bind(show_alternative, services, step), [state, agent, annotator] + form_in, out,
                     api_name=False)
    fresh = bind(new_conversation, services)
    gr.on([new.click, chatbot.clear], fresh, [state, agent, annotator] + form_in, out, api_name=False)
    conversations.input(bind(open_conversation, services), [conversations, state, agent, annotator] + form_in, out,
                        api_name=False)
    listing = bind(refresh_list, services)
    gr.on([annotator.change, conversations.focus], listing, [agent, annotator, state], [conversations, guide],
          api_name=False, show_progress="hidden")
    agent.change(bind(refresh_versions, services), [agent], [version], api_name=False)
    agent.focus(bind(refresh_agents, services), [agent], [agent], api_name=False)
    agent.change(fresh, [state, agent, annotator] + form_in, out, api_name=False) \
        .then(listing, [agent, annotator, state], [conversations, guide], api_name=False)
    gr.on(None, listing, [agent, annotator, state], [conversations, guide], api_name=False)  # on load
    gr.Timer(15).tick(bind(refresh_versions, services), [agent, version], [version], api_name=False,
                      show_progress="hidden")
