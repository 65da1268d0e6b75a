"""Arena tab: two anonymous versions answer the same prompt side by side; the vote reveals them.

The round logic lives in ``ui.flows.arena`` (shared with the REST router). The browser only ever
holds the pair id: which version wrote which side is looked up in the Store after the vote.
"""
from __future__ import annotations

import time
from typing import Optional

import gradio as gr

from storage import Conflict
from ui.views.arena import BT_VS_ELO, leaderboard_view, reveal_text, win_rate_view
from ui.views.text import literal_chat, literal_html, status_label
from ui.flows.arena import cast_vote, close_round, open_round, stream_round
from ui.state.leaderboard import counted_votes
from ui.services import Services, bind
from ui.tabs.chat_view import cut_badge
from ui.tabs.common import BLUR_ON_SEND, PAINT_SECONDS, check_message, guidelines_markdown, labeller
from ui.tabs.errors import error_status, handles_errors

VOTES = (("a", "A is better"), ("b", "B is better"), ("tie", "Tie"), ("both_bad", "Both are bad"))
HINT = "Ask something: two anonymous versions answer side by side. Vote to reveal which is which."
KEYS = "Keys (when not typing): **A**/1 A is better · **B**/2 B is better · **T**/3 tie · **X**/4 both are bad"


# ---- handlers --------------------------------------------------------------------------------------
def empty_state() -> dict:
    return {"pair_id": None}


def _vote_buttons(enabled: bool) -> list:
    return [gr.Button(interactive=enabled) for _ in VOTES]


def _sides(shared: list[dict], text_a: str, text_b: str, mark_a: str = "", mark_b: str = "") -> tuple[list, list]:
    """Both chat views: the shared context, then each side's reply (HTML shown as typed, a cut reply marked)."""
    shared = literal_chat(shared)
    return (shared + [{"role": "assistant", "content": literal_html(text_a) + mark_a}],
            shared + [{"role": "assistant", "content": literal_html(text_b) + mark_b}])


def renamed_since(state: dict, name: str) -> Optional[str]:
    """Why ``name`` may not vote on or continue the round on screen, played under another name (None when they
    may): a vote is the word of the person who read both replies, as REST keeps someone else's round from them."""
    player = (state or {}).get("player")
    if (state or {}).get("pair_id") is None or player is None or player == name:
        return None
    return (f"This round was played as {player}, and the name is now {name}: nothing was stored. Change the name "
            f"back to {player} to vote on it, or Start over to play a round as {name}.")


def play_round(services: Services, text: str, state: dict, agent_name: str, annotator: str,
               request: gr.Request = None):
    """Start (or continue) a round: both replies stream side by side, then the vote buttons open."""
    store = services.store
    state = dict(state or empty_state())
    pair_id = state.get("pair_id")
    try:
        name = labeller(services, request, annotator)
        check_message(services, text)
        if pair_id is not None and store.arena_vote(pair_id) is None:
            raise Conflict("Vote on the current round first (or Start over).")
        if renamed_since(state, name) is not None:
            raise Conflict(renamed_since(state, name))
        rnd = open_round(services, agent_name, [{"role": "user", "content": text}], name, continue_pair_id=pair_id)
    except Exception as exc:  # nothing started: the text stays in the box, the vote buttons as they were
        status = error_status(exc)
        open_vote = pair_id is not None and store.arena_vote(pair_id) is None
        yield (gr.Chatbot(), gr.Chatbot(), state, text, status, *_vote_buttons(open_vote))
        return
    state["pair_id"] = None  # the new round has no pair until both replies are stored
    shared = [{"role": m.role, "content": m.content} for m in store.branch(rnd.user.id)]
    chat_a, chat_b = _sides(shared, "", "")
    answering = "Both versions are answering…"
    # The first update also resets the labels a previous reveal set.
    yield (gr.Chatbot(value=chat_a, label="Model A"), gr.Chatbot(value=chat_b, label="Model B"), state, "",
           answering, *_vote_buttons(False))
    painted = 0.0
    try:
        for text_a, text_b in stream_round(rnd):
            if time.monotonic() - painted < PAINT_SECONDS:  # at most ~20 repaints a second
                continue
            painted = time.monotonic()
            chat_a, chat_b = _sides(shared, text_a, text_b)
            yield (chat_a, chat_b, state, "", answering, *_vote_buttons(False))
        pair = close_round(store, rnd)
    except Exception as exc:  # a failed generation: say so, keep the app usable
        status = error_status(exc, lead="generation failed: ")
        yield (chat_a, chat_b, state, text, f"{status}. Start over to try again.", *_vote_buttons(False))
        return
    state["pair_id"], state["player"] = pair.id, name
    chat_a, chat_b = _sides(shared, rnd.a.saved.content, rnd.b.saved.content, cut_badge(rnd.a.saved),
                            cut_badge(rnd.b.saved))
    yield (chat_a, chat_b, state, "", "Which reply is better? Your vote reveals the versions.", *_vote_buttons(True))


@handles_errors(lambda status: (gr.Chatbot(), gr.Chatbot(), f"{status} Start over for a new round.",
                                  *_vote_buttons(False)))
def submit_vote(services: Services, winner: str, state: dict, annotator: str, request: gr.Request = None):
    """Store the vote once, then reveal which version wrote each side."""
    store = services.store
    pair_id = (state or {}).get("pair_id")
    if pair_id is None:
        return (gr.Chatbot(), gr.Chatbot(), "Play a round first: ask something.", *_vote_buttons(False))
    name = labeller(services, request, annotator)
    renamed = renamed_since(state, name)
    if renamed is not None:  # refused like REST refuses someone else's round; the buttons stay for the player
        return (gr.Chatbot(), gr.Chatbot(), error_status(Conflict(renamed)), *_vote_buttons(True))
    vote = cast_vote(store, pair_id, winner, name)
    pol_a = store.get_policy(vote.policy_a_id) if vote.policy_a_id is not None else None
    pol_b = store.get_policy(vote.policy_b_id) if vote.policy_b_id is not None else None
    label = lambda side, p: f"Model {side} · {status_label(p)}" if p else f"Model {side}"  # noqa: E731
    text = reveal_text(vote.winner, pol_a, pol_b, vote.id)
    if vote.winner != winner:
        text = "This round was already voted on; the first vote counts. " + text
    return (gr.Chatbot(label=label("A", pol_a)), gr.Chatbot(label=label("B", pol_b)), text, *_vote_buttons(False))


def start_over():
    """Forget the current round (everything stays stored)."""
    return (gr.Chatbot(value=[], label="Model A"), gr.Chatbot(value=[], label="Model B"), empty_state(), HINT,
            *_vote_buttons(False))


def leaderboard_tables(services: Services, agent_name: str):
    """Leaderboard and win-rate matrix of an agent, from every counted comparison between two of its versions
    (excluded annotators' left out)."""
    store = services.store
    agent = store.get_agent(agent_name)
    table = services.leaderboards.table(agent.id)  # the last table at once; a refit runs off this thread
    matrix = win_rate_view(counted_votes(store, agent.id), store.list_policies(agent.id))
    return leaderboard_view(table), matrix


# ---- layout ----------------------------------------------------------------------------------------
def build_arena(services: Services, annotator: Optional[gr.Textbox] = None, tab: Optional[gr.Tab] = None) -> None:
    """Lay out the tab (inside ``with gr.Tab(...)``; pass it to refresh on select) and bind its handlers."""
    store = services.store
    agents = [a.name for a in store.list_agents()]
    if annotator is None:
        annotator = gr.Textbox(label="Your name", max_length=64)
    state = gr.State(empty_state())
    agent = gr.Dropdown(agents, value=agents[0], label="Agent")
    with gr.Accordion("Annotation guidelines", open=False):
        guide = gr.Markdown(guidelines_markdown(services, agents[0]))
    with gr.Row(equal_height=True):
        chat_a = gr.Chatbot(label="Model A", height=380, allow_tags=False, latex_delimiters=[],
                            placeholder="Model A's reply")
        chat_b = gr.Chatbot(label="Model B", height=380, allow_tags=False, latex_delimiters=[],
                            placeholder="Model B's reply")
    with gr.Row():
        buttons = [gr.Button(label, interactive=False, elem_id=f"arena-{winner}") for winner, label in VOTES]
    status = gr.Markdown(HINT)
    gr.Markdown(KEYS, elem_id="arena-keys")  # hidden on a touch screen (ui.tabs.vote_page.CSS)
    with gr.Row():
        text = gr.Textbox(placeholder="Type a prompt (or a follow-up after voting) and press Enter", show_label=False,
                          scale=5)  # no max_length: a long paste is refused with a reason, never cut
        send = gr.Button("Send", variant="primary", scale=1)
    again = gr.Button("Start over")
    with gr.Accordion("Leaderboard", open=True):
        board = gr.Dataframe(label="Versions by Bradley–Terry rating (Elo scale, 95% bootstrap CI)",
                             interactive=False, wrap=True)
        matrix = gr.Dataframe(label="Win rate of the row version against the column version (ties count half)",
                              interactive=False)
        gr.Markdown(BT_VS_ELO)

    chats = [chat_a, chat_b]
    play = bind(play_round, services)
    tables = bind(leaderboard_tables, services)
    for trigger in (text.submit, send.click):
        trigger(play, [text, state, agent, annotator], chats + [state, text, status] + buttons,
                api_name="arena" if trigger == send.click else False, concurrency_limit=None,
                concurrency_id="generate", js=BLUR_ON_SEND)
    for (winner, _), button in zip(VOTES, buttons):
        button.click(bind(submit_vote, services, winner), [state, annotator], chats + [status] + buttons,
                     api_name=f"arena_vote_{winner}").then(tables, [agent], [board, matrix], api_name=False)
    again.click(start_over, None, chats + [state, status] + buttons, api_name=False)
    agent.change(start_over, None, chats + [state, status] + buttons, api_name=False)
    gr.on(None, tables, [agent], [board, matrix], api_name=False)  # on load and on agent change
    guidelines = bind(guidelines_markdown, services)
    gr.on(None, guidelines, [agent], [guide], api_name=False)
    gr.Timer(10).tick(tables, [agent], [board, matrix], api_name=False, show_progress="hidden")
    if tab is not None:  # a hidden tab's timer does not repaint it: refresh when it is shown (guidelines too)
        tab.select(tables, [agent], [board, matrix], api_name=False, show_progress="hidden") \
            .then(guidelines, [agent], [guide], api_name=False, show_progress="hidden")
