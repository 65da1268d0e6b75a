"""Arena tab: two anonymous versions answer the same prompt side by side; the vote reveals them.

The round logic (pick a pair, generate two sibling replies, remember the pair, vote, continue) is
plain functions shared with the REST router. The browser only ever holds the pair id: which version
wrote which side is looked up in the Store after the vote.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Iterator, Optional

import gradio as gr
import numpy as np

from rlhf.leaderboard import choose_pair
from rlhf.serving import Busy
from storage import Agent, ArenaPair, Comparison, Conflict, Message, Policy, Store, StoreError
from ui import chatflow, views
from ui.auth import signed_in_annotator
from ui.permissions import Forbidden
from ui.services import Services, bind

VOTES = (("a", "A is better"), ("b", "B is better"), ("tie", "Tie"), ("both_bad", "Both are bad"))
HINT = "Ask something: two anonymous versions answer side by side. Vote to reveal which is which."


# ---- round logic (shared with ui.rest_arena) ------------------------------------------------------
@dataclass
class Round:
    """An arena round being generated: both replies answer the same user message."""

    agent: Agent
    user: Message
    a: chatflow.PendingReply
    b: chatflow.PendingReply

    def cancel(self) -> None:
        self.a.stream.cancel()
        self.b.stream.cancel()


def need_two_message(agent: Agent, servable: int) -> str:
    return (f"The arena compares two versions of an agent, and {agent.name!r} has {servable} servable version"
            f"{'' if servable == 1 else 's'}. Retrain it on the collected feedback (ratings and comparisons) "
            "to publish a new version, or promote an archived one, then come back.")


def draw_pair(store: Store, agent: Agent, rng: Optional[np.random.Generator] = None) -> tuple[Policy, Policy]:
    """The two versions of the next round (A, B), chosen by ``choose_pair`` from votes and BT ratings."""
    policies = store.list_policies(agent.id)
    table = views.board(store.list_comparisons(agent.id), policies, n_boot=0)
    candidates = views.pair_candidates(table)
    if len(candidates) < 2:
        raise Conflict(need_two_message(agent, len(candidates)))
    a_id, b_id = choose_pair(candidates, rng if rng is not None else np.random.default_rng())
    return store.get_policy(a_id), store.get_policy(b_id)


def continuation_parent(store: Store, pair_id: str) -> Message:
    """The reply a follow-up continues under: the vote's winner (A on a tie)."""
    vote = store.arena_vote(pair_id)
    if vote is None:
        raise Conflict("vote on this round before continuing it")
    if vote.winner == "both_bad":
        raise Conflict("both replies of this round were bad; start a new round instead of continuing")
    return store.get_message(vote.message_b_id if vote.winner == "b" else vote.message_a_id)


def open_round(services: Services, agent_name: Optional[str], messages: list[dict], annotator: Optional[str] = None,
               continue_pair_id: Optional[str] = None, rng: Optional[np.random.Generator] = None) -> Round:
    """Record the user turn(s) and start both replies (queued on the one PolicyServer)."""
    store = services.store
    if continue_pair_id is not None:
        parent = continuation_parent(store, continue_pair_id)
        agent = chatflow.agent_of(store, parent)
        if agent_name is not None and store.get_agent(agent_name).id != agent.id:
            raise Conflict(f"arena pair {continue_pair_id} belongs to agent {agent.name!r}")
    else:
        agent = store.get_agent(agent_name)  # None = the default (first) agent
    policy_a, policy_b = draw_pair(store, agent, rng)
    params = chatflow.gen_params(services.config, agent)
    if continue_pair_id is not None:
        user = store.append_messages(parent.conversation_id, messages, parent_id=parent.id)[-1]
    else:
        user = chatflow.add_user_turn(store, agent, messages, None, annotator, source="arena")
    server = services.server_for(agent)
    a = chatflow.begin_reply(store, server, user.id, policy_a, params)
    try:
        b = chatflow.begin_reply(store, server, user.id, policy_b, params)
    except BaseException:
        a.stream.cancel()
        raise
    return Round(agent, user, a, b)


def stream_round(rnd: Round) -> Iterator[tuple[str, str]]:
    """Both replies' text so far, each time either grows (one reader thread per side feeds a queue)."""
    events: "queue.Queue[tuple[int, Optional[str], Optional[BaseException]]]" = queue.Queue()

    def pump(side: int, pending: chatflow.PendingReply) -> None:
        try:
            for delta in pending:
                events.put((side, delta, None))
            events.put((side, None, None))
        except BaseException as exc:  # handed to the consumer, which re-raises it
            events.put((side, None, exc))

    for side, pending in enumerate((rnd.a, rnd.b)):
        threading.Thread(target=pump, args=(side, pending), name=f"arena-{'ab'[side]}", daemon=True).start()
    texts, running = ["", ""], 2
    try:
        while running:
            side, delta, exc = events.get()
            if exc is not None:
                raise exc
            if delta is None:
                running -= 1
                continue
            texts[side] += delta
            yield texts[0], texts[1]
    finally:
        if running:  # the consumer went away or a side failed: stop generating the other one
            rnd.cancel()


def close_round(store: Store, rnd: Round) -> ArenaPair:
    """Store both replies and the pair they form (call after both streams ended)."""
    a, b = rnd.a.save(), rnd.b.save()
    return store.create_arena_pair(rnd.agent.id, a.id, b.id)


def cast_vote(store: Store, pair_id: str, winner: str, annotator: Optional[str] = None) -> Comparison:
    """Record the vote of a round (a second vote returns the first)."""
    return store.vote_arena_pair(pair_id, winner, annotator)


# ---- handlers --------------------------------------------------------------------------------------
def empty_state() -> dict:
    return {"pair_id": None}


def _vote_buttons(enabled: bool) -> list:
    return [gr.Button(interactive=enabled) for _ in VOTES]


def _sides(shared: list[dict], text_a: str, text_b: str) -> tuple[list[dict], list[dict]]:
    """Both chat views: the shared context, then each side's reply (HTML shown as typed)."""
    shared = views.literal_chat(shared)
    return (shared + [{"role": "assistant", "content": views.literal_html(text_a)}],
            shared + [{"role": "assistant", "content": views.literal_html(text_b)}])


def play_round(services: Services, text: str, state: dict, agent_name: str, annotator: str,
               request: gr.Request = None):
    """Start (or continue) a round: both replies stream side by side, then the vote buttons open."""
    store = services.store
    state = dict(state or empty_state())
    pair_id = state.get("pair_id")
    try:
        name = signed_in_annotator(services, request, annotator)
        if pair_id is not None and store.arena_vote(pair_id) is None:
            raise Conflict("Vote on the current round first (or Start over).")
        rnd = open_round(services, agent_name, [{"role": "user", "content": text}], name, continue_pair_id=pair_id)
    except (StoreError, Busy, Forbidden) as exc:
        gr.Warning(str(exc))
        open_vote = pair_id is not None and store.arena_vote(pair_id) is None
        yield (gr.Chatbot(), gr.Chatbot(), state, text, f"⚠️ {exc}", *_vote_buttons(open_vote))
        return
    state["pair_id"] = None  # the new round has no pair until both replies are stored
    shared = [{"role": m.role, "content": m.content} for m in store.branch(rnd.user.id)]
    chat_a, chat_b = _sides(shared, "", "")
    answering = "Both versions are answering…"
    # The first update also resets the labels a previous reveal set.
    yield (gr.Chatbot(value=chat_a, label="Model A"), gr.Chatbot(value=chat_b, label="Model B"), state, "",
           answering, *_vote_buttons(False))
    try:
        for text_a, text_b in stream_round(rnd):
            chat_a, chat_b = _sides(shared, text_a, text_b)
            yield (chat_a, chat_b, state, "", answering, *_vote_buttons(False))
        pair = close_round(store, rnd)
    except Exception as exc:  # a failed generation: say so, keep the app usable
        gr.Warning(f"generation failed: {exc}")
        yield (chat_a, chat_b, state, text, f"⚠️ generation failed: {exc}. Start over to try again.",
               *_vote_buttons(False))
        return
    state["pair_id"] = pair.id
    chat_a, chat_b = _sides(shared, rnd.a.saved.content, rnd.b.saved.content)
    yield (chat_a, chat_b, state, "", "Which reply is better? Your vote reveals the versions.", *_vote_buttons(True))


def submit_vote(services: Services, winner: str, state: dict, annotator: str, request: gr.Request = None):
    """Store the vote once, then reveal which version wrote each side."""
    store = services.store
    pair_id = (state or {}).get("pair_id")
    if pair_id is None:
        return (gr.Chatbot(), gr.Chatbot(), "Play a round first: ask something.", *_vote_buttons(False))
    try:
        vote = cast_vote(store, pair_id, winner, signed_in_annotator(services, request, annotator))
    except (StoreError, Forbidden) as exc:
        gr.Warning(str(exc))
        return (gr.Chatbot(), gr.Chatbot(), f"⚠️ {exc} Start over for a new round.", *_vote_buttons(False))
    pol_a = store.get_policy(vote.policy_a_id) if vote.policy_a_id is not None else None
    pol_b = store.get_policy(vote.policy_b_id) if vote.policy_b_id is not None else None
    label = lambda side, p: f"Model {side} · {views.status_label(p)}" if p else f"Model {side}"  # noqa: E731
    text = views.reveal_text(vote.winner, pol_a, pol_b, vote.id)
    if vote.winner != winner:
        text = "This round was already voted on; the first vote counts. " + text
    return (gr.Chatbot(label=label("A", pol_a)), gr.Chatbot(label=label("B", pol_b)), text, *_vote_buttons(False))


def start_over():
    """Forget the current round (everything stays stored)."""
    return (gr.Chatbot(value=[], label="Model A"), gr.Chatbot(value=[], label="Model B"), empty_state(), HINT,
            *_vote_buttons(False))


def leaderboard_tables(services: Services, agent_name: str):
    """Leaderboard and win-rate matrix of an agent, from every comparison between two of its versions."""
    store = services.store
    policies = store.list_policies(agent_name)
    comparisons = store.list_comparisons(agent_name)
    table = views.board(comparisons, policies)
    return views.leaderboard_view(table), views.win_rate_view(comparisons, policies)


# ---- layout ----------------------------------------------------------------------------------------
def build_arena(services: Services, annotator: Optional[gr.Textbox] = None, tab: Optional[gr.Tab] = None) -> None:
    """Lay out the tab (inside ``with gr.Tab(...)``; pass it to refresh on select) and bind its handlers."""
    store = services.store
    agents = [a.name for a in store.list_agents()]
    if annotator is None:
        annotator = gr.Textbox(label="Your name", max_length=64)
    state = gr.State(empty_state())
    agent = gr.Dropdown(agents, value=agents[0], label="Agent")
    with gr.Row(equal_height=True):
        chat_a = gr.Chatbot(label="Model A", height=380, allow_tags=False, placeholder="Model A's reply")
        chat_b = gr.Chatbot(label="Model B", height=380, allow_tags=False, placeholder="Model B's reply")
    with gr.Row():
        buttons = [gr.Button(label, interactive=False) for _, label in VOTES]
    status = gr.Markdown(HINT)
    with gr.Row():
        text = gr.Textbox(placeholder="Type a prompt (or a follow-up after voting) and press Enter", show_label=False,
                          scale=5, max_length=services.config.serving.max_message_chars)
        send = gr.Button("Send", variant="primary", scale=1)
    again = gr.Button("Start over")
    with gr.Accordion("Leaderboard", open=True):
        board = gr.Dataframe(label="Versions by Bradley–Terry rating (Elo scale, 95% bootstrap CI)",
                             interactive=False, wrap=True)
        matrix = gr.Dataframe(label="Win rate of the row version against the column version (ties count half)",
                              interactive=False)

    chats = [chat_a, chat_b]
    play = bind(play_round, services)
    tables = bind(leaderboard_tables, services)
    for trigger in (text.submit, send.click):
        trigger(play, [text, state, agent, annotator], chats + [state, text, status] + buttons,
                api_name="arena" if trigger == send.click else False, concurrency_limit=None,
                concurrency_id="generate")
    for (winner, _), button in zip(VOTES, buttons):
        button.click(bind(submit_vote, services, winner), [state, annotator], chats + [status] + buttons,
                     api_name=f"arena_vote_{winner}").then(tables, [agent], [board, matrix], api_name=False)
    again.click(start_over, None, chats + [state, status] + buttons, api_name=False)
    agent.change(start_over, None, chats + [state, status] + buttons, api_name=False)
    gr.on(None, tables, [agent], [board, matrix], api_name=False)  # on load and on agent change
    gr.Timer(10).tick(tables, [agent], [board, matrix], api_name=False, show_progress="hidden")
    if tab is not None:  # a hidden tab's timer does not repaint it: refresh when it is shown
        tab.select(tables, [agent], [board, matrix], api_name=False, show_progress="hidden")
