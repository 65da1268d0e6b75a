"""Vote tab: one context, two replies, four buttons (and Skip); the next pair appears as soon as the vote is stored.

Pairs come from the vote queue (``ui.flows.vote_queue``): generated in the background and picked where a vote teaches
the reward model the most. The browser holds the item id and the name it was shown to: a vote names the item on
screen, and one made under another name, or on an item voted or skipped in another tab, is refused in plain words
(the next item shows under the reason). The page ignores input until a new pair has been read (``vote_page``).
Keys: A/1, B/2, T/3, X/4, S to skip.
"""
from __future__ import annotations

from typing import Optional

import gradio as gr

from storage import Conflict
from storage.vote_queue import VERDICTS
from ui.views.text import literal_chat, literal_html
from ui.flows.vote_queue import cast_vote, left_for, next_item, skip_item
from ui.services import Services, bind
from ui.tabs.chat_view import cut_badge
from ui.tabs.common import guidelines_markdown, labeller
from ui.tabs.errors import error_status
from ui.tabs.vote_page import LOADED, SHOWN

VOTES = (("a", "A is better"), ("b", "B is better"), ("tie", "Tie"), ("both_bad", "Both bad"))
EMPTY = ("Nothing to vote on right now: new pairs are generated in the background while nobody is chatting. "
         "Press *Refresh* in a moment.")
KEYS = "Keys (when not typing): **A**/1 · **B**/2 · **T**/3 tie · **X**/4 both bad · **S** skip"
# Why this pair, in an annotator's words (the REST API returns the reason code).
WHY = {"uncertain": "a close call: this is where your vote helps the model most",
       "random": "a random pick (keeps the sample fair)",
       "cold_start": "a random pick (the model has too few votes to choose yet)",
       "overlap": "a second opinion: someone else voted on this pair too",
       "direct": "picked directly"}


def empty_state() -> dict:
    return {"item_id": None, "shown_to": None}


def _shown_item(services: Services, state: dict, annotator: str, request) -> tuple[Optional[int], str]:
    """(the item on screen, the name to store under); Conflict when the name changed since the item was shown."""
    item_id = (state or {}).get("item_id")
    name = labeller(services, request, annotator)
    shown_to = (state or {}).get("shown_to")
    if item_id is not None and shown_to is not None and shown_to != name:
        raise Conflict(f"Item #{item_id} was shown to {shown_to}, and the name is now {name}: nothing was stored. "
                       f"Here is the next item for {name}.")
    return item_id, name


def _buttons(enabled: bool) -> list:
    return [gr.Button(interactive=enabled) for _ in range(len(VOTES) + 1)]  # the votes and Skip


def show(item: Optional[dict], note: str = "", left: Optional[int] = None, store=None,
         name: Optional[str] = None) -> tuple:
    """The tab's outputs for an item (None: an empty queue): context, A, B, state, status, buttons."""
    if item is None:
        return ([], [], [], empty_state(), note + EMPTY, *_buttons(False))

    def reply(side):
        message = store.get_message(item[side]["message_id"]) if store is not None else None
        mark = cut_badge(message) if message is not None else ""
        return [{"role": "assistant", "content": literal_html(item[side]["content"]) + mark}]

    count = f" · {left} left for you" if left is not None else ""
    status = f"{note}Item #{item['item_id']}{count} · {WHY.get(item['reason'], item['reason'])}. Which reply is better?"
    state = {"item_id": item["item_id"], "shown_to": name}
    return (literal_chat(item["messages"]), reply("a"), reply("b"), state, status, *_buttons(True))


def load_next(services: Services, state: dict, agent_name: str, annotator: str, request: gr.Request = None,
              note: str = "") -> tuple:
    """Show the annotator's next item (their unvoted one first)."""
    try:
        name = labeller(services, request, annotator)
        item = next_item(services, agent_name, name)
        left = left_for(services, agent_name, name) if item is not None else 0
    except Exception as exc:  # the note of the vote or skip before it stays
        return show(None, f"{note}{error_status(exc)} ")
    return show(item, note, left, services.store, name)


def submit_vote(services: Services, winner: str, state: dict, agent_name: str, annotator: str,
                request: gr.Request = None) -> tuple:
    """Store the vote on the item on screen, then show the next item at once."""
    if (state or {}).get("item_id") is None:
        return load_next(services, state, agent_name, annotator, request)
    try:
        item_id, name = _shown_item(services, state, annotator, request)
        vote = cast_vote(services, item_id, winner, name, retry=False)  # a second vote is a stale page: refused
        note = f"Stored as comparison #{vote.id}: {VERDICTS[vote.winner]} on item #{item_id}. "
    except Exception as exc:  # the next item still shows, under the reason this vote was refused
        note = f"{error_status(exc)} "
    return load_next(services, empty_state(), agent_name, annotator, request, note)


def skip(services: Services, state: dict, agent_name: str, annotator: str, request: gr.Request = None) -> tuple:
    """Pass on this item (it goes to someone else) and show the next one."""
    note = ""
    if (state or {}).get("item_id") is not None:
        try:
            item_id, name = _shown_item(services, state, annotator, request)
            skip_item(services, item_id, name)
            note = f"Skipped item #{item_id}. "
        except Exception as exc:  # the next item still shows, under the reason the skip was refused
            note = f"{error_status(exc)} "
    return load_next(services, empty_state(), agent_name, annotator, request, note)


# ---- layout ----------------------------------------------------------------------------------------
def build_vote(services: Services, annotator: Optional[gr.Textbox] = None, tab: Optional[gr.Tab] = None) -> None:
    """Lay out the tab (inside ``with gr.Tab(...)``; pass it to load an item when shown) and bind its handlers."""
    agents = [a.name for a in services.store.list_agents()]
    if annotator is None:
        annotator = gr.Textbox(label="Your name", max_length=64)
    state = gr.State(empty_state())
    with gr.Row(equal_height=False):  # one row, so the vote buttons stay on a 1000-pixel-high screen
        agent = gr.Dropdown(agents, value=agents[0], label="Agent", scale=1, min_width=160)
        with gr.Column(scale=3), gr.Accordion("Annotation guidelines", open=False):
            guide = gr.Markdown(guidelines_markdown(services, agents[0]))
    # autoscroll off: a long context or reply opens at its first line, not scrolled to its end; no share or clear
    # icons on judged text (``vote_page.CSS`` hides the clear one, which has no switch)
    judged = dict(allow_tags=False, autoscroll=False, latex_delimiters=[], buttons=["copy"])
    context = gr.Chatbot(label="Context", height=190, placeholder="The conversation so far", elem_id="vote-context",
                         **judged)
    with gr.Row(equal_height=True):
        reply_a = gr.Chatbot(label="Reply A", height=270, placeholder="Reply A", min_width=240, elem_id="vote-reply-a",
                             **judged)
        reply_b = gr.Chatbot(label="Reply B", height=270, placeholder="Reply B", min_width=240, elem_id="vote-reply-b",
                             **judged)
    with gr.Column(elem_id="vote-bar"):  # on a phone it stays on screen (``vote_page.CSS``)
        with gr.Row(elem_id="vote-buttons"):
            buttons = [gr.Button(label, interactive=False, elem_id=f"vote-{winner}") for winner, label in VOTES]
            skip_button = gr.Button("Skip", interactive=False, elem_id="vote-skip", variant="secondary")
        status = gr.Markdown("Open this tab to get a pair to vote on.", elem_id="vote-status")
    gr.Markdown(KEYS, elem_id="vote-keys")
    refresh = gr.Button("Refresh", size="sm")

    outputs = [context, reply_a, reply_b, state, status] + buttons + [skip_button]
    load = bind(load_next, services)
    guidelines = bind(guidelines_markdown, services)

    def shown(event, js: str = LOADED) -> None:  # a pair is on screen: the page takes input once it was read
        event.then(None, None, None, js=js, api_name=False, show_progress="hidden") \
            .then(guidelines, [agent], [guide], api_name=False, show_progress="hidden")  # as an admin saved them

    for (winner, _), button in zip(VOTES, buttons):
        shown(button.click(bind(submit_vote, services, winner), [state, agent, annotator], outputs,
                           api_name=f"queue_vote_{winner}", concurrency_limit=None, concurrency_id="queue"), SHOWN)
    shown(skip_button.click(bind(skip, services), [state, agent, annotator], outputs, api_name=False,
                            concurrency_limit=None, concurrency_id="queue"), SHOWN)
    shown(refresh.click(load, [state, agent, annotator], outputs, api_name="queue_next", concurrency_limit=None,
                        concurrency_id="queue"))
    shown(agent.change(load, [state, agent, annotator], outputs, api_name=False))
    gr.on(None, guidelines, [agent], [guide], api_name=False)
    if tab is not None:  # the next item when the tab is shown
        shown(tab.select(load, [state, agent, annotator], outputs, api_name=False))
