"""Vote tab: one context, two replies, four buttons; the next pair appears as soon as the vote is stored.

Pairs come from the vote queue (``ui.flows.queue``): generated in the background and picked where the reward
model is least sure, so every vote teaches it the most. The browser only holds the item id.
"""
from __future__ import annotations

from typing import Optional

import gradio as gr

from storage import StoreError
from ui import views
from ui.auth import signed_in_annotator
from ui.flows.queue import cast_vote, next_item, reason_text
from ui.permissions import Forbidden
from ui.services import Services, bind

VOTES = (("a", "A"), ("b", "B"), ("tie", "Tie"), ("both_bad", "Both bad"))
EMPTY = ("Nothing to vote on right now: new pairs are generated in the background while nobody is chatting. "
         "Press *Refresh* in a moment.")


# ---- handlers --------------------------------------------------------------------------------------
def empty_state() -> dict:
    return {"item_id": None}


def show(item: Optional[dict], note: str = "") -> tuple:
    """The tab's outputs for an item (None: an empty queue): context, A, B, state, status, four buttons."""
    if item is None:
        return ([], [], [], empty_state(), note + EMPTY, *[gr.Button(interactive=False) for _ in VOTES])
    reply = lambda side: [{"role": "assistant", "content": views.literal_html(item[side]["content"])}]  # noqa: E731
    status = f"{note}Item #{item['item_id']} · {reason_text(item['reason'])}. Which reply is better?"
    return (views.literal_chat(item["messages"]), reply("a"), reply("b"), {"item_id": item["item_id"]}, status,
            *[gr.Button(interactive=True) for _ in VOTES])


def load_next(services: Services, state: dict, agent_name: str, annotator: str, request: gr.Request = None,
              note: str = "") -> tuple:
    """Show the annotator's next item (their unvoted one first)."""
    try:
        item = next_item(services, agent_name, signed_in_annotator(services, request, annotator))
    except (StoreError, Forbidden) as exc:
        gr.Warning(str(exc))
        return show(None, f"{note}⚠️ {exc} ")
    return show(item, note)


def submit_vote(services: Services, winner: str, state: dict, agent_name: str, annotator: str,
                request: gr.Request = None) -> tuple:
    """Store the vote, then show the next item at once."""
    item_id = (state or {}).get("item_id")
    if item_id is None:
        return load_next(services, state, agent_name, annotator, request)
    try:
        vote = cast_vote(services, item_id, winner, signed_in_annotator(services, request, annotator))
        note = f"Stored as comparison #{vote.id}. "
    except (StoreError, Forbidden) as exc:
        gr.Warning(str(exc))
        note = f"⚠️ {exc} "
    return load_next(services, empty_state(), agent_name, annotator, request, note)


# ---- layout ----------------------------------------------------------------------------------------
def build_vote(services: Services, annotator: Optional[gr.Textbox] = None, tab: Optional[gr.Tab] = None) -> None:
    """Lay out the tab (inside ``with gr.Tab(...)``; pass it to load an item when shown) and bind its handlers."""
    agents = [a.name for a in services.store.list_agents()]
    if annotator is None:
        annotator = gr.Textbox(label="Your name", max_length=64)
    state = gr.State(empty_state())
    agent = gr.Dropdown(agents, value=agents[0], label="Agent")
    context = gr.Chatbot(label="Context", height=220, allow_tags=False, latex_delimiters=[],
                         placeholder="The conversation so far")
    with gr.Row(equal_height=True):
        reply_a = gr.Chatbot(label="Reply A", height=320, allow_tags=False, latex_delimiters=[], placeholder="Reply A")
        reply_b = gr.Chatbot(label="Reply B", height=320, allow_tags=False, latex_delimiters=[], placeholder="Reply B")
    with gr.Row():
        buttons = [gr.Button(label, interactive=False, elem_id=f"vote-{winner}") for winner, label in VOTES]
    status = gr.Markdown("Open this tab to get a pair to vote on.")
    refresh = gr.Button("Refresh", size="sm")

    outputs = [context, reply_a, reply_b, state, status] + buttons
    load = bind(load_next, services)
    for (winner, _), button in zip(VOTES, buttons):
        button.click(bind(submit_vote, services, winner), [state, agent, annotator], outputs,
                     api_name=f"queue_vote_{winner}", concurrency_limit=None, concurrency_id="queue")
    refresh.click(load, [state, agent, annotator], outputs, api_name="queue_next", concurrency_limit=None,
                  concurrency_id="queue")
    agent.change(load, [state, agent, annotator], outputs, api_name=False)
    if tab is not None:
        tab.select(load, [state, agent, annotator], outputs, api_name=False)
