"""Chat & Rate tab: talk to an agent version, rate replies (thumbs, flags, score, note), regenerate."""
from __future__ import annotations

from typing import Optional

import gradio as gr

from rlhf.serving.server import Busy
from storage import FLAGS, Store, StoreError
from ui.flows import chat as chatflow
from ui.auth import signed_in_annotator
from ui.permissions import Forbidden, current_user
from ui.services import Services, bind
from ui.views import literal_html

FEEDBACK_OPTIONS = ("Like", "Dislike") + FLAGS


def empty_state() -> dict:
    return {"conversation_id": None, "ids": [], "selected": None}


# ---- view logic (pure, tested without Gradio) --------------------------------------------------
def branch_view(store: Store, leaf_id: Optional[int]) -> tuple[list[dict], list[int]]:
    """Chatbot messages and their ids for the branch ending at ``leaf_id``."""
    if leaf_id is None:
        return [], []
    msgs = store.branch(leaf_id)
    return [{"role": m.role, "content": literal_html(m.content)} for m in msgs], [m.id for m in msgs]


def version_choices(store: Store, agent_name: str) -> tuple[list[tuple[str, int]], Optional[int]]:
    """Dropdown choices (label, policy id) of an agent's servable versions, and the active one."""
    policies = [p for p in store.list_policies(agent_name) if p.status in ("active", "candidate")]
    choices = [(f"v{p.version}" + (" (active)" if p.status == "active" else "") +
                (" · base" if p.is_base else ""), p.id) for p in reversed(policies)]
    return choices, store.active_policy(agent_name).id


def rating_summary(store: Store, message_id: Optional[int], annotator: Optional[str]) -> str:
    """One line describing the selected reply and this annotator's current rating of it."""
    if message_id is None:
        return "No reply selected yet: send a message, then click a reply to rate it."
    state = store.effective_rating(message_id, annotator) or {}
    parts = [f"Selected reply **#{message_id}**"]
    if state.get("thumb"):
        parts.append("👍" if state["thumb"] > 0 else "👎")
    if state.get("score"):
        parts.append(f"score {state['score']}/5")
    if state.get("flags"):
        parts.append("flags: " + ", ".join(state["flags"]))
    if state.get("note"):
        parts.append("note saved")
    return " · ".join(parts)


def annotator_name(name: Optional[str]) -> Optional[str]:
    name = (name or "").strip()
    return name or None


# ---- handlers ------------------------------------------------------------------------------------
def _params(services: Services, agent, max_new_tokens, temperature, top_p, seed):
    seed = None if seed in (None, "") else int(seed)
    return chatflow.gen_params(services.config, agent, int(max_new_tokens), float(temperature), float(top_p), seed)


def send_message(services: Services, text: str, state: dict, agent_name: str, policy_id, annotator: str,
                 max_new_tokens, temperature, top_p, seed, request: gr.Request = None):
    """Record the user's message, stream the reply into the chat, record the reply."""
    store = services.store
    state = dict(state or empty_state())
    history, ids = branch_view(store, state["ids"][-1] if state["ids"] else None)
    try:
        name = signed_in_annotator(services, request, annotator)
        agent = store.get_agent(agent_name)
        policy = chatflow.resolve_policy(store, agent, int(policy_id) if policy_id is not None else None)
        params = _params(services, agent, max_new_tokens, temperature, top_p, seed)
        server = services.server_for(agent)
        user_msg = chatflow.add_user_turn(store, agent, [{"role": "user", "content": text}],
                                          state["conversation_id"], name)
        pending = chatflow.begin_reply(store, server, user_msg.id, policy, params)
    except (StoreError, Busy, Forbidden) as exc:
        gr.Warning(str(exc))
        yield history, state, text, f"⚠️ {exc}"
        return
    state["conversation_id"] = user_msg.conversation_id
    shown = history + [{"role": "user", "content": literal_html(text)}, {"role": "assistant", "content": ""}]
    so_far = ""
    for delta in pending:
        so_far += delta
        shown[-1]["content"] = literal_html(so_far)
        yield shown, state, "", "Generating…"
    reply = pending.save()
    history, state["ids"] = branch_view(store, reply.id)
    state["selected"] = reply.id
    yield history, state, "", rating_summary(store, reply.id, name)


def regenerate_reply(services: Services, state: dict, policy_id, annotator: str, max_new_tokens, temperature,
                     top_p, seed, request: gr.Request = None):
    """Generate an alternative (sibling) reply to the last user message; both replies are kept."""
    store = services.store
    state = dict(state or empty_state())
    last_reply = next((i for i in reversed(state["ids"]) if store.get_message(i).role == "assistant"), None)
    history, _ = branch_view(store, state["ids"][-1] if state["ids"] else None)
    if last_reply is None:
        yield history, state, "Nothing to regenerate yet."
        return
    try:
        name = signed_in_annotator(services, request, annotator)
        parent = chatflow.sibling_parent(store, last_reply)
        agent = chatflow.agent_of(store, parent)
        policy = chatflow.resolve_policy(store, agent, int(policy_id) if policy_id is not None else None)
        params = _params(services, agent, max_new_tokens, temperature, top_p, seed)
        pending = chatflow.begin_reply(store, services.server_for(agent), parent.id, policy, params)
    except (StoreError, Busy, Forbidden) as exc:
        gr.Warning(str(exc))
        yield history, state, f"⚠️ {exc}"
        return
    shown, _ = branch_view(store, parent.id)
    shown = shown + [{"role": "assistant", "content": ""}]
    so_far = ""
    for delta in pending:
        so_far += delta
        shown[-1]["content"] = literal_html(so_far)
        yield shown, state, "Regenerating…"
    reply = pending.save()
    history, state["ids"] = branch_view(store, reply.id)
    state["selected"] = reply.id
    n = len(store.siblings(reply.id))
    yield history, state, f"Alternative {n} stored. " + rating_summary(store, reply.id, name)


def like_reply(services: Services, state: dict, annotator: str, data: gr.LikeData, request: gr.Request = None):
    """Thumbs and flags from the chatbot's feedback icons, stored at once (a double click stores one)."""
    store = services.store
    index = data.index if isinstance(data.index, int) else data.index[0]
    ids = (state or {}).get("ids", [])
    if not 0 <= index < len(ids):
        return state, "That message is not part of this conversation."
    message_id = ids[index]
    try:
        name = signed_in_annotator(services, request, annotator)
        if data.liked is True or data.liked == "Like":
            store.record_rating(message_id, name, thumb=1)
        elif data.liked is False or data.liked == "Dislike":
            store.record_rating(message_id, name, thumb=-1)
        elif isinstance(data.liked, str) and data.liked in FLAGS:
            current = store.effective_rating(message_id, name) or {}
            store.record_rating(message_id, name, flags=sorted(set(current.get("flags") or []) | {data.liked}))
        else:
            return state, "Feedback cleared in the view; stored feedback is kept (it is append-only)."
    except (StoreError, Forbidden) as exc:
        gr.Warning(str(exc))
        return state, f"⚠️ {exc}"
    state = dict(state, selected=message_id)
    return state, rating_summary(store, message_id, name)


def select_reply(services: Services, state: dict, annotator: str, data: gr.SelectData, request: gr.Request = None):
    """Clicking a reply selects it for the score/flags/note panel."""
    store = services.store
    index = data.index if isinstance(data.index, int) else data.index[0]
    ids = (state or {}).get("ids", [])
    if not 0 <= index < len(ids) or store.get_message(ids[index]).role != "assistant":
        return state, "Select a reply (an assistant message) to rate it."
    state = dict(state, selected=ids[index])
    viewer = current_user(services, request) if services.auth is not None else annotator_name(annotator)
    return state, rating_summary(store, ids[index], viewer)


def save_rating(services: Services, state: dict, annotator: str, score, flags, note: str,
                request: gr.Request = None):
    """Store score, flags and note for the selected reply."""
    store = services.store
    selected = (state or {}).get("selected")
    if selected is None:
        return "Select a reply first."
    note = note if note and note.strip() else None
    score = None if score in (None, "") else score  # the Store validates it: 6, NaN, "five" get a clear message
    flags = list(flags) if flags else None
    if score is None and flags is None and note is None:
        return "Choose a score, a flag or write a note first."
    try:
        name = signed_in_annotator(services, request, annotator)
        store.record_rating(selected, name, score=score, flags=flags, note=note)
    except (StoreError, Forbidden) as exc:
        gr.Warning(str(exc))
        return f"⚠️ {exc}"
    return "Saved. " + rating_summary(store, selected, name)


def refresh_versions(services: Services, agent_name: str, current=None):
    """Version dropdown for an agent (picks up versions published while the app runs), keeping the pick."""
    choices, active = version_choices(services.store, agent_name)
    keep = current if current in [c[1] for c in choices] else active
    return gr.Dropdown(choices=choices, value=keep)


def refresh_agents(services: Services, current: str):
    """Agent dropdown with agents created since the page loaded (keeps the pick)."""
    return gr.Dropdown(choices=[a.name for a in services.store.list_agents()], value=current)


def new_conversation():
    return [], empty_state(), "New conversation: say something.", None


# ---- layout ---------------------------------------------------------------------------------------
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
    chatbot = gr.Chatbot(feedback_options=FEEDBACK_OPTIONS, height=420, label="Conversation", allow_tags=False,
                         latex_delimiters=[],  # text is text: no $$ math
                         placeholder="Say something: replies stream in, and every rating is stored at once.")
    with gr.Row():
        text = gr.Textbox(placeholder="Type a message and press Enter", show_label=False, scale=5,
                          max_length=cfg.max_message_chars)
        send = gr.Button("Send", variant="primary", scale=1)
    with gr.Row():
        regen = gr.Button("Regenerate")
        new = gr.Button("New conversation")
    status = gr.Markdown("No reply selected yet: send a message, then click a reply to rate it.")
    with gr.Accordion("Rate the selected reply", open=True):
        with gr.Row():
            score = gr.Radio([1, 2, 3, 4, 5], label="Score (1–5)", scale=2)
            flags = gr.CheckboxGroup(list(FLAGS), label="Flags", scale=3)
        note = gr.Textbox(label="Note", lines=2, max_length=cfg.max_message_chars)
        save = gr.Button("Save rating")
    with gr.Accordion("Generation settings", open=False):
        with gr.Row():
            max_tokens = gr.Slider(8, 1024, value=cfg.max_new_tokens, step=8, label="Max new tokens")
            temperature = gr.Slider(0, 2, value=cfg.temperature, step=0.05, label="Temperature")
            top_p = gr.Slider(0.05, 1, value=cfg.top_p, step=0.05, label="Top-p")
            seed = gr.Number(value=None, precision=0, label="Seed (empty = random)")
    gen = [max_tokens, temperature, top_p, seed]

    send_fn = bind(send_message, services)
    for trigger in (text.submit, send.click):
        trigger(send_fn, [text, state, agent, version, annotator] + gen, [chatbot, state, text, status],
                api_name="chat" if trigger == send.click else False, concurrency_limit=None,
                concurrency_id="generate")
    regen.click(bind(regenerate_reply, services), [state, version, annotator] + gen,
                [chatbot, state, status], api_name="regenerate", concurrency_limit=None, concurrency_id="generate")
    chatbot.like(bind(like_reply, services), [state, annotator], [state, status], api_name=False)
    chatbot.select(bind(select_reply, services), [state, annotator], [state, status], api_name=False)
    save.click(bind(save_rating, services), [state, annotator, score, flags, note], [status],
               api_name="rate")
    new.click(new_conversation, None, [chatbot, state, status, score], api_name=False)
    agent.change(bind(refresh_versions, services), [agent], [version], api_name=False)
    agent.focus(bind(refresh_agents, services), [agent], [agent], api_name=False)
    agent.change(new_conversation, None, [chatbot, state, status, score], api_name=False)
    gr.Timer(15).tick(bind(refresh_versions, services), [agent, version], [version], api_name=False,
                      show_progress="hidden")
