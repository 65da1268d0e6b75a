"""The Gradio Blocks: a header, the annotator name, and one tab per module."""
from __future__ import annotations

import gradio as gr

from ui.arena import build_arena
from ui.chat import build_chat
from ui.dashboard import build_dashboard
from ui.services import Services
from ui.training import build_training

TITLE = "RLHF Studio"


def header(services: Services) -> str:
    """Top line: what is served and in which mode the app runs."""
    mode = "single-user local mode (no login configured)"
    return (f"# {TITLE}\nImprove a model by talking to it: chat, rate, compare, retrain. "
            f"Base model: `{services.server.model_name}` on {services.server.device} · {mode}")


def build_ui(services: Services) -> gr.Blocks:
    """All tabs, wired to ``services``."""
    with gr.Blocks(title=TITLE) as demo:
        gr.Markdown(header(services))
        annotator = gr.Textbox(label="Your name (stored with every rating)", placeholder="e.g. alice",
                               max_length=64)
        remembered = gr.BrowserState("", storage_key="rlhf-studio-annotator", secret="rlhf-studio")
        with gr.Tab("Chat & Rate"):
            build_chat(services, annotator)
        with gr.Tab("Arena"):
            build_arena(services, annotator)
        with gr.Tab("Dashboard"):
            build_dashboard(services)
        with gr.Tab("Training"):
            build_training(services)
        demo.load(lambda saved: saved or "", [remembered], [annotator], api_name=False)
        annotator.change(lambda name: name, [annotator], [remembered], api_name=False)
    return demo
