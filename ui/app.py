"""The Gradio Blocks: a header, the annotator name, and one tab per module."""
from __future__ import annotations

import importlib.util
import json

import gradio as gr

from rlhf.config import data_is_ephemeral
from ui.tabs.arena import build_arena
from ui.tabs.chat_layout import CSS as CHAT_CSS
from ui.tabs.chat import build_chat
from ui.tabs.dashboard import build_dashboard
from ui.tabs.data import build_data_tab
from ui.permissions import current_user, is_admin
from ui.services import Services, bind
from ui.tabs.training import build_training
from ui.tabs.vote import build_vote
from ui.tabs.vote_page import CSS as VOTE_CSS
from ui.tabs.vote_page import guard_js

TITLE = "RLHF Studio"
EPHEMERAL = ("\n\n> ⚠️ **Data is NOT persistent here.** This Space has no persistent storage mounted at `{mount}`, "
             "so every conversation, rating and trained version is **lost on restart**. Turn on persistent "
             "storage in the Space settings (or export your data from the Data tab).")
NO_OAUTH = ("\n\n> ⚠️ Hugging Face sign-in needs `gradio[oauth]` (listed in requirements.txt); it is not "
            "installed, so nobody can sign in and ratings cannot be stored.")

# Keyboard shortcuts, active while no text field has the focus: the tab on screen decides what a key does.
# Vote and Arena: A/1, B/2, T/3 (tie), X/4 (both bad), and S (skip) in Vote; Chat: 1-5 score the reply in the label
# panel (stored at once, like a click). Sending a message gives the focus back, so the keys work right after a send.
# The tabs' own layout rules (STYLE) are added to the page once, here: Gradio 6 takes CSS only at launch/mount.
SHORTCUTS = """() => {
  if (window.__rlhfShortcuts) return;
  window.__rlhfShortcuts = true;
  const style = document.createElement("style");
  style.textContent = STYLE;
  document.head.appendChild(style);
  const shown = (el) => el !== null && el.offsetParent !== null;
  const press = (el) => { if (shown(el) && !el.disabled) { el.click(); return true; } return false; };
  const byId = (id) => document.getElementById(id);
  const votes = {a: "a", "1": "a", b: "b", "2": "b", t: "tie", "3": "tie", x: "both_bad", "4": "both_bad"};
  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey || event.repeat) return;
    const target = event.target;
    const typing = target && (target.isContentEditable || target.tagName === "TEXTAREA" || target.tagName === "SELECT"
      || (target.tagName === "INPUT" && !["radio", "checkbox", "button"].includes(target.type)));
    if (typing) return;
    const key = event.key.toLowerCase();
    let done = false;
    if (shown(byId("vote-a"))) {
      done = key === "s" ? press(byId("vote-skip")) : (key in votes && press(byId("vote-" + votes[key])));
    } else if (shown(byId("arena-a"))) {
      done = key in votes && press(byId("arena-" + votes[key]));
    } else if (shown(byId("chat-score")) && "12345".includes(key) && key.length === 1) {
      done = press(document.querySelector('#chat-score input[type="radio"][value="' + key + '"]'));
    }
    if (done) event.preventDefault();
  });
}"""


# The remembered name goes into the box only when nobody has typed there since the page opened: the check runs in
# the browser at the moment the name arrives (a name typed while the page loaded is never replaced). NOTE_TYPING is
# installed on load, before the remembered name is asked for.
NOTE_TYPING = """(saved) => {
  if (!window.__rlhfNameWatch) {
    window.__rlhfNameWatch = true;
    document.addEventListener("input", (event) => {
      const box = event.target && event.target.closest && event.target.closest("#annotator-name");
      if (box) window.__rlhfNameTyped = true;
    }, true);
  }
  return saved;
}"""
RESTORE_NAME = """(saved) => {
  const box = document.querySelector("#annotator-name textarea, #annotator-name input");
  const now = box ? box.value : "";
  return (window.__rlhfNameTyped || now.trim()) ? now : saved;
}"""


# On a phone a table keeps readable columns and scrolls sideways (Gradio squeezes the desktop column widths into
# 390 pixels, one letter per line); the leaderboard and other wide blocks scroll instead of overflowing the page.
PHONE_CSS = """
@media (max-width: 640px) {
  .table-wrap { overflow-x: auto !important; }
  .table-wrap table { width: max-content !important; }
  .table-wrap th, .table-wrap td, .table-wrap .body-cell {
    width: 8.5em !important; min-width: 8.5em !important; max-width: 8.5em !important; flex: 0 0 8.5em !important; }
  .table-wrap .virtual-body, .table-wrap .virtual-row { width: max-content !important; }
}
"""


def page_css() -> str:
    """The tabs' layout rules (label panel beside the reply, phone widths), one style sheet for the page."""
    return CHAT_CSS + PHONE_CSS + VOTE_CSS


def oauth_available() -> bool:
    """True when Gradio's OAuth extras (authlib, itsdangerous) are installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("authlib", "itsdangerous"))


def header(services: Services) -> str:
    """Top line: what is served and in which mode the app runs, plus loud warnings."""
    auth = services.auth
    mode = auth.describe() if auth is not None else "**single-user local mode** (no login configured: you are admin)"
    text = (f"# {TITLE}\nImprove a model by talking to it: chat, rate, compare, retrain. "
            f"Base model: `{services.server.model_name}` on {services.server.device} · {mode}")
    if data_is_ephemeral(services.config):
        text += EPHEMERAL.format(mount=services.config.server.persistent_dir)
    if auth is not None and auth.hf_sign_in and not oauth_available():
        text += NO_OAUTH
    return text


def signed_in_line(services: Services, request: gr.Request):
    """The annotator box in team mode: the signed-in name, read-only."""
    name = current_user(services, request)
    if name is None:
        return gr.Textbox(value="", placeholder="not signed in", interactive=False)
    role = "admin" if is_admin(services, request) else "annotator"
    return gr.Textbox(value=name, label=f"Signed in as ({role})", interactive=False)


def build_ui(services: Services) -> gr.Blocks:
    """All tabs, wired to ``services``."""
    team = services.auth is not None
    with gr.Blocks(title=TITLE) as demo:
        gr.Markdown(header(services))
        if team:
            with gr.Row():
                annotator = gr.Textbox(label="Signed in as", interactive=False, scale=4, max_length=64)
                if services.auth.hf_sign_in and oauth_available():
                    gr.LoginButton(scale=1)
                elif services.auth.mode == "users":
                    gr.Button("Log out", link="/logout", scale=1)
        else:
            annotator = gr.Textbox(label="Your name (required: every rating and vote is stored under it; "
                                         "remembered in this browser)", placeholder="e.g. alice", max_length=64,
                                   elem_id="annotator-name")
            remembered = gr.BrowserState("", storage_key="rlhf-studio-annotator", secret="rlhf-studio")
            restored = gr.Textbox(visible="hidden", elem_id="annotator-restored")  # the name remembered, on its way
            # Saved in the browser itself, at the keystroke, and as the box's first listener (the page sends a change's
            # listeners in order, each waiting on the queue): a reload right after typing, or a busy queue, must not
            # bring back the name typed before it and store the next labels under someone else's.
            annotator.change(None, [annotator], [remembered], js="(name) => name", api_name=False)
        with gr.Tab("Chat & Rate"):
            build_chat(services, annotator)
        with gr.Tab("Arena") as arena_tab:
            build_arena(services, annotator, arena_tab)
        with gr.Tab("Vote") as vote_tab:
            build_vote(services, annotator, vote_tab)
        with gr.Tab("Dashboard") as dashboard_tab:
            build_dashboard(services, dashboard_tab)
        with gr.Tab("Training"):
            build_training(services)
        with gr.Tab("Data") as data_tab:
            build_data_tab(services, data_tab)
        demo.load(None, None, None, js=SHORTCUTS.replace("STYLE", json.dumps(page_css())), api_name=False)
        demo.load(None, None, None, js=guard_js(services.config.queue.read_ms), api_name=False)
        if team:
            demo.load(bind(signed_in_line, services), None, [annotator], api_name=False)
        else:
            # Nothing remembered (a first visit), or a name typed while the page loaded: leave the box alone, or
            # the typed name would be replaced and the first ratings stored under someone else's.
            demo.load(lambda saved: saved or gr.skip(), [remembered], [restored], js=NOTE_TYPING, api_name=False)
            restored.change(None, [restored], [annotator], js=RESTORE_NAME, api_name=False)
    return demo
