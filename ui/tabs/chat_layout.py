"""The Chat & Rate tab's layout: its components, made once and handed to the wiring (``ui.tabs.chat``) by name.

Also the page script and style rules the tab needs: the outline and number on the bubble the label panel labels,
the panel read again when the page gets the focus back, and tap-sized controls on a phone.
"""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from storage import FLAGS
from ui.services import Services
from ui.tabs import chat_view as cv
from ui.tabs.common import guidelines_markdown

THUMBS = ("Like", "Dislike")  # flags are ticked in the label panel: one icon state per bubble can show one thumb
IDLE = "No reply selected yet: send a message, then click a reply to label it."

CSS = """
@media (min-width: 900px) { #chat-labels { position: sticky; top: 0.5rem; align-self: flex-start; } }
@media (max-width: 640px) { #chat-conversation { height: 46vh !important; max-height: 46vh !important; } }
#chat-conversation .rlhf-marked { outline: 3px solid var(--color-accent); outline-offset: 2px; }
#chat-conversation .rlhf-marked::after { content: "✎ " attr(data-mark); display: block; font-size: 0.8em;
  font-weight: 600; opacity: 0.85; margin-top: 0.3em; }
@media (pointer: coarse) { .rlhf-keys { display: none; } }
@media (max-width: 640px), (pointer: coarse) {
  #chat-conversation .message-buttons button, #chat-conversation button[aria-label="Like"],
  #chat-conversation button[aria-label="Dislike"], #chat-conversation button[aria-label="Liked"],
  #chat-conversation button[aria-label="Disliked"] { min-width: 44px !important; min-height: 44px !important; }
  #chat-labels button { min-height: 44px !important; }
  #chat-score label, #chat-flags label { min-height: 44px; }
}
"""

# Run once on load: outline the bubble the panel labels (the server's hidden marker says which one, and the chat
# redraws its bubbles while a reply streams, so the outline is put back after each redraw), and read the panel
# again from the Store when the page gets the focus back (another tab or device may have labelled meanwhile).
# On a phone the panel sits under the conversation: when another reply is marked, or Regenerate is tapped, the page
# brings the conversation's top to the top of the screen and scrolls the chat's own box to the marked reply, so the
# reply (or its alternative as it streams) and the panel's score are on screen together.
PAGE_JS = """() => {
  if (window.__rlhfChatMarks) return;
  window.__rlhfChatMarks = true;
  const phone = window.matchMedia("(max-width: 640px)");
  // The marked bubble sits in the chat's own scroll box: that box is scrolled (never the page) so it shows.
  const scrollerOf = (el, conv) => {
    for (let node = el.parentElement; node && conv.contains(node); node = node.parentElement) {
      const style = getComputedStyle(node).overflowY;
      if ((style === "auto" || style === "scroll") && node.scrollHeight > node.clientHeight) return node;
    }
    return null;
  };
  const showMarked = (conv) => {
    const bubble = conv.querySelector(".rlhf-marked");
    const box = bubble && scrollerOf(bubble, conv);
    if (!box) return;
    const b = bubble.getBoundingClientRect(), s = box.getBoundingClientRect();
    if (b.bottom < s.top + 24 || b.top > s.bottom - 24) box.scrollTop += b.top - s.top - 8;
  };
  // For a moment after a new mark (or a Regenerate) the chat may redraw and scroll itself, so the reveal is kept up:
  // on each redraw and at set times (a scroll of the chat's own is not a redraw).
  let revealUntil = 0;
  const revealSoon = () => {
    revealUntil = Date.now() + 2000;
    [50, 400, 1200, 2000].forEach((ms) => setTimeout(toConversation, ms));
  };
  const toConversation = () => {
    const conv = document.getElementById("chat-conversation");
    if (!phone.matches || !conv) return;
    const top = conv.getBoundingClientRect().top;
    if (top < 0 || top > 8) conv.scrollIntoView({block: "start"});
    showMarked(conv);
  };
  let shown = -1;
  // A label input (score, flag, note) may redraw the chat: its box is brought back to the reply being labelled (the
  // page itself stays put, under the finger).
  const boxToMarked = () => {
    const conv = document.getElementById("chat-conversation");
    if (phone.matches && conv) showMarked(conv);
  };
  document.addEventListener("click", (event) => {
    if (!event.target.closest) return;
    if (event.target.closest("#chat-regenerate")) revealSoon();
    else if (event.target.closest("#chat-labels")) [50, 600, 1500].forEach((ms) => setTimeout(boxToMarked, ms));
  }, true);
  const apply = () => {
    const conv = document.getElementById("chat-conversation");
    if (!conv) return;
    const marker = document.querySelector("#chat-mark [data-index]");
    const index = marker ? Number(marker.dataset.index) : -1;
    const label = marker ? (marker.dataset.label || "") : "";
    if (index !== shown) {
      shown = index;
      if (index >= 0) revealSoon();
    }
    conv.querySelectorAll('[data-testid="bot"], [data-testid="user"]').forEach((bubble, i) => {
      const on = i === index;
      if (bubble.classList.contains("rlhf-marked") !== on) bubble.classList.toggle("rlhf-marked", on);
      if (on && bubble.dataset.mark !== label) bubble.dataset.mark = label;
      if (!on && bubble.dataset.mark !== undefined) delete bubble.dataset.mark;
    });
    if (Date.now() < revealUntil) toConversation();
  };
  new MutationObserver(apply).observe(document.body, {subtree: true, childList: true, characterData: true,
                                                       attributes: true, attributeFilter: ["data-index"]});
  const reread = () => {
    const button = document.getElementById("chat-refresh");
    if (document.visibilityState === "visible" && button) {
      window.__rlhfRereadAt = Date.now();
      button.click();
    }
  };
  document.addEventListener("input", (event) => {
    if (!event.target.closest) return;
    if (event.target.closest("#chat-note")) window.__rlhfNoteTypedAt = Date.now();
    else if (event.target.closest("#annotator-name")) window.__rlhfRereadAt = Date.now();  // a name re-reads too
  }, true);
  window.addEventListener("focus", reread);
  document.addEventListener("visibilitychange", reread);
}"""

# After a re-read (focus, a name change): its note goes into the box unless the person typed there since the re-read
# was sent (its answer was read from what the box held before), or unless the server said to keep the box.
KEEP_NOTE = "__rlhf_keep_the_note_box__"  # chat_labels: the re-read leaves the note box as it is
NOTE_GATE_JS = """(read) => {
  const box = document.querySelector("#chat-note textarea");
  const typed = (window.__rlhfNoteTypedAt || 0) >= (window.__rlhfRereadAt || 0);
  if (read === "%s" || (typed && window.__rlhfNoteTypedAt)) return box ? box.value : "";
  return read;
}""" % KEEP_NOTE


@dataclass
class ChatParts:
    """The tab's components."""

    state: gr.State
    agent: gr.Dropdown
    version: gr.Dropdown
    conversations: gr.Dropdown
    guide: gr.Markdown
    chatbot: gr.Chatbot
    status: gr.Markdown
    text: gr.Textbox
    send: gr.Button
    new: gr.Button
    form_for: gr.Number
    panel_as: gr.Textbox
    touched: gr.Number
    header: gr.Markdown
    score: gr.Radio
    clear_score: gr.Button
    flags: gr.CheckboxGroup
    note: gr.Textbox
    save: gr.Button
    regen: gr.Button
    prev_alt: gr.Button
    next_alt: gr.Button
    mark: gr.HTML
    refresh: gr.Button
    note_read: gr.Textbox
    gen: list

    @property
    def out(self) -> list:
        """What a handler that changes the conversation shown updates (see ``chat.N_OUT``)."""
        return [self.chatbot, self.state, self.text, self.status, self.conversations, self.regen, self.prev_alt,
                self.next_alt, self.new]

    @property
    def panel_in(self) -> list:
        return [self.form_for, self.panel_as, self.note, self.touched]

    @property
    def panel_out(self) -> list:
        """The label panel as ``chat_labels.panel`` fills it."""
        return [self.form_for, self.panel_as, self.header, self.score, self.flags, self.note, self.touched]

    @property
    def reread_out(self) -> list:
        """A re-read's panel: ``panel_out`` with the note going to ``note_read`` (see ``NOTE_GATE_JS``)."""
        return [self.note_read if c is self.note else c for c in self.panel_out]

    @property
    def label_out(self) -> list:
        """What one label write updates (``chat_labels._label``)."""
        return [self.status, self.form_for, self.panel_as, self.header, self.score, self.flags, self.touched]


def _top(services: Services, choices, active):
    agents = [a.name for a in services.store.list_agents()]
    with gr.Row():
        agent = gr.Dropdown(agents, value=agents[0], label="Agent", scale=1)
        version = gr.Dropdown(choices, value=active, label="Version", scale=1)
        conversations = gr.Dropdown([], value=None, label="Your conversations", scale=2,
                                    info="Pick one to go back to it (⏳ = your last message has no reply yet)")
    with gr.Accordion("Annotation guidelines", open=False):
        guide = gr.Markdown(guidelines_markdown(services, agents[0]))
    return agent, version, conversations, guide


def _conversation():
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
    return chatbot, status, text, send, new


def _panel(services: Services) -> dict:
    """The label panel, with the actions on its reply."""
    parts = {
        "form_for": gr.Number(value=None, visible=False, precision=0),  # the reply the panel shows
        "panel_as": gr.Textbox(value="", visible=False),  # whose labels it shows
        "touched": gr.Number(value=0, visible=False, precision=0),  # the person's clicks on it so far
        "mark": gr.HTML(cv.mark_html(None, []), visible="hidden", elem_id="chat-mark"),
        "refresh": gr.Button("Read the labels again", visible="hidden", elem_id="chat-refresh"),
        # a re-read's note, put in the box by NOTE_GATE_JS unless the person typed there after the re-read was sent
        "note_read": gr.Textbox(value="", visible=False),
        "header": gr.Markdown(cv.panel_header(services.store, None, None), elem_id="chat-panel-header"),
    }
    with gr.Row(equal_height=False):
        parts["score"] = gr.Radio([1, 2, 3, 4, 5], label="Score (1–5) · stored when clicked", elem_id="chat-score",
                                  interactive=False, scale=4)
        parts["clear_score"] = gr.Button("Clear score", size="sm", scale=1, min_width=80, elem_id="chat-clear-score")
    parts["flags"] = gr.CheckboxGroup(list(FLAGS), label="Flags · stored when ticked", elem_id="chat-flags",
                                      interactive=False)
    parts["note"] = gr.Textbox(label="Note", lines=2, placeholder="Optional: what is wrong or good about it",
                               elem_id="chat-note", interactive=True)
    parts["save"] = gr.Button("Save note", elem_id="chat-save-note", size="sm")
    with gr.Row():
        parts["regen"] = gr.Button("Regenerate", size="sm", min_width=90, elem_id="chat-regenerate")
        parts["prev_alt"] = gr.Button("◀ Previous alternative", size="sm", min_width=90)
        parts["next_alt"] = gr.Button("Next alternative ▶", size="sm", min_width=90)
    return parts


def _settings(services: Services) -> list:
    cfg = services.config.serving
    with gr.Accordion("Generation settings", open=False):
        with gr.Row():
            max_tokens = gr.Slider(8, 1024, value=cfg.max_new_tokens, step=8, label="Max new tokens")
            temperature = gr.Slider(0, 2, value=cfg.temperature, step=0.05, label="Temperature")
            top_p = gr.Slider(0.05, 1, value=cfg.top_p, step=0.05, label="Top-p")
            seed = gr.Textbox(value="", label="Seed (empty = random)", placeholder="random",
                              info="A fixed seed repeats the same reply")
    return [max_tokens, temperature, top_p, seed]


def layout_chat(services: Services, state_value: dict, choices, active) -> ChatParts:
    """Lay out the tab (inside ``with gr.Tab(...)``): the conversation, and the label panel beside the reply (under
    it on a phone)."""
    state = gr.State(state_value)
    agent, version, conversations, guide = _top(services, choices, active)
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=360):
            chatbot, status, text, send, new = _conversation()
        with gr.Column(scale=2, min_width=300, elem_id="chat-labels"):
            panel = _panel(services)
    return ChatParts(state=state, agent=agent, version=version, conversations=conversations, guide=guide,
                     chatbot=chatbot, status=status, text=text, send=send, new=new, gen=_settings(services), **panel)
