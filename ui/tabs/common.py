"""What the annotation tabs share: who a label is stored under, and the agent's annotation guidelines."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import gradio as gr

from storage import InvalidInput
from ui.auth import signed_in_annotator
from ui.permissions import Forbidden
from ui.services import Services
from ui.tabs.errors import handles_errors

NAME_FIRST = ("Type your name in the box at the top first: every label is stored under it (asked once, then "
              "remembered in this browser).")
PAINT_SECONDS = 0.05  # while a reply streams, at most ~20 repaints a second (the browser re-renders the bubble)
NO_GUIDELINES = "*No guidelines for this agent yet. Admins write them in Data → Agents.*"
# Run in the browser when a message or prompt is sent: the box lets go of the focus, so the keyboard shortcuts
# (1-5 score in Chat, A/B/T/X vote in the Arena) work at once instead of typing into the box. Inputs pass through.
BLUR_ON_SEND = "(...args) => { document.activeElement?.blur(); return args; }"

# The trash icon empties the page's chat at once; its event (and New conversation's) then resets the tab's state on
# the server. A message sent (or a Regenerate pressed) in between waits for that reset, for at most 10 s, so it
# never goes to the conversation just left. MOVING runs in the browser at the click, MOVED after the reset.
MOVING = "() => { window.__rlhfMoving = (window.__rlhfMoving || 0) + 1; }"
MOVED = "() => { window.__rlhfMoving = Math.max(0, (window.__rlhfMoving || 0) - 1); }"
SEND_AFTER_MOVES = """async (...args) => {
  document.activeElement?.blur();
  for (const end = Date.now() + 10000; (window.__rlhfMoving || 0) > 0 && Date.now() < end;) {
    await new Promise((done) => setTimeout(done, 50));
  }
  return args;
}"""


def labeller(services: Services, request, typed: Optional[str]) -> str:
    """The name a label is stored under: the signed-in user, or in local mode the name typed at the top.
    Without one, Forbidden: a label nobody can be held to is worthless for per-annotator quality control."""
    name = signed_in_annotator(services, request, typed)
    if not name:
        raise Forbidden(NAME_FIRST)
    return name


@handles_errors(lambda status: NO_GUIDELINES, warn=False)
def guidelines_markdown(services: Services, agent_name: Optional[str]) -> str:
    """The agent's annotation guidelines as shown above Chat, Arena and Vote (none for an agent that is gone)."""
    return services.store.get_agent(agent_name).guidelines.strip() or NO_GUIDELINES


def check_message(services: Services, text: Optional[str]) -> str:
    """A message to send, or InvalidInput in the annotator's words. Nothing is cut: a message over the limit is
    refused whole and stays in the box (a browser-side max length would cut a paste without a word)."""
    limit = services.config.serving.max_message_chars
    if not text or not text.strip():
        raise InvalidInput("Type a message first.")
    if len(text) > limit:
        raise InvalidInput(f"Your message is {len(text):,} characters; the limit is {limit:,}. Nothing was sent "
                           "and nothing was cut: shorten it (it is still in the box) and send again.")
    return text


# ---- "are you sure?" ---------------------------------------------------------------------------------
def build_question(yes_label: str, variant: str = "stop") -> SimpleNamespace:
    """A hidden question box with a "Yes" and a Cancel button, for an action that costs a lot or cannot be undone:
    the action's button shows the question (``ask``), "Yes" runs it, Cancel (or a changed pick) hides it again."""
    with gr.Group(visible=False) as box:
        text = gr.Markdown()
        with gr.Row():
            yes = gr.Button(yes_label, variant=variant)
            no = gr.Button("Cancel")
    no.click(hide_question, None, [box, text], api_name=False)
    return SimpleNamespace(box=box, text=text, yes=yes, no=no)


def ask(question: Optional[str], refusal: str = "") -> tuple:
    """Outputs (box, text, status) showing ``question``; or, when there is nothing to ask (None), the box hidden
    and ``refusal`` in the status line."""
    if question is None:
        return gr.Group(visible=False), "", refusal
    return gr.Group(visible=True), question, ""


def hide_question() -> tuple:
    """The question box hidden (answered, cancelled, or the pick changed under it)."""
    return gr.Group(visible=False), ""
