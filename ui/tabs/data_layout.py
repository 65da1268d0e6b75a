"""The Data tab's layout: its components, made once and handed to the wiring (``ui.tabs.data``) by name."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

import gradio as gr

from rlhf.interop.export import FORMATS
from storage import FLAGS
from ui.services import Services
from ui.tabs.agents import build_agents_panel
from ui.tabs.common import build_question

ALL = "all"
ADMIN_NOTE = "Admin tools: excluded annotators stay in the Store but are left out of training and training exports."
FEEDBACK_WIDTHS = ["10%", "8%", "5%", "8%", "8%", "12%", "19%", "20%", "6%", "4%"]
EXPORT_NOTE = ("Formats: raw `jsonl`/`parquet`/`hf`; training `trl-preference`, `kto`; cluster `openrlhf`, `verl` "
               "(with LAUNCH.md). The CLI and `GET /api/v1/export` write the same files.")
# What a refresh fills (``data.refresh_data`` returns a dict with these names; ``DataParts.keyed`` maps them to
# the components)
REFRESHED = ("table", "count", "who", "stats", "agreement", "speed", "alpha", "flagged", "pick")


@dataclass
class DataParts:
    """The tab's components."""

    agent: gr.Dropdown
    who: gr.Dropdown
    kind: gr.Dropdown
    flag: gr.Dropdown
    text: gr.Textbox
    count: gr.Markdown
    table: gr.Dataframe
    stats: gr.Dataframe
    agreement: gr.HTML
    speed: gr.HTML
    alpha: gr.Markdown
    access: gr.Markdown
    pick: gr.Dropdown
    exclude: gr.Button
    include: gr.Button
    exclude_question: SimpleNamespace  # ``common.build_question``: box, text, yes
    exclude_status: gr.Markdown
    flagged: gr.Dataframe
    fmt: gr.Dropdown
    run: gr.Button
    download: gr.DownloadButton
    export_status: gr.Markdown
    token_user: gr.Textbox
    token_label: gr.Textbox
    token_days: gr.Number
    token_button: gr.Button
    token_out: gr.Markdown
    token_box: gr.Textbox
    tokens: gr.Dataframe
    revoke_id: gr.Number
    revoke_button: gr.Button
    revoke_question: SimpleNamespace
    admin_only: list = field(default_factory=list)  # the buttons only admins may press

    @property
    def filters(self) -> list:
        """What a refresh reads: the agent and the feedback filters."""
        return [self.agent, self.who, self.kind, self.flag, self.text]

    @property
    def refreshed(self) -> list:
        """What a refresh fills (``REFRESHED``)."""
        return [getattr(self, name) for name in REFRESHED]

    def keyed(self, handler: Callable) -> Callable:
        """``handler`` (its result a dict keyed by these parts' names) returning the same dict keyed by the
        components, as Gradio takes it; the signature stays, so Gradio still injects ``gr.Request``."""
        @functools.wraps(handler)
        def by_component(*args, **kwargs):
            return {getattr(self, name): value for name, value in handler(*args, **kwargs).items()}
        return by_component


def _feedback(services: Services) -> dict:
    """The agent, the filters and the feedback table."""
    agents = [a.name for a in services.store.list_agents()]
    parts = {"agent": gr.Dropdown(agents, value=agents[0], label="Agent")}
    with gr.Row():
        parts["who"] = gr.Dropdown([ALL], value=ALL, label="Annotator", scale=1)
        parts["kind"] = gr.Dropdown([ALL, "rating", "vote"], value=ALL, label="Kind", scale=1)
        parts["flag"] = gr.Dropdown([ALL, *FLAGS], value=ALL, label="Flag", scale=1)
        parts["text"] = gr.Textbox(label="Search prompt, reply and note", scale=2)
    parts["count"] = gr.Markdown()
    parts["table"] = gr.Dataframe(label="Feedback (newest first; long texts are shortened: search above to find one)",
                                  interactive=False, wrap=True, max_height=640, column_widths=FEEDBACK_WIDTHS)
    return parts


def _quality() -> dict:
    with gr.Accordion("Annotation quality", open=True):
        stats = gr.Dataframe(label="Per annotator", interactive=False)
        with gr.Row():
            with gr.Column():
                gr.Markdown("**Agreement with the majority** (%, on items others judged too)")
                agreement = gr.HTML()
            with gr.Column():
                gr.Markdown("**Median seconds per item**")
                speed = gr.HTML()
        alpha = gr.Markdown()
    return {"stats": stats, "agreement": agreement, "speed": speed, "alpha": alpha}


def _exclusion() -> dict:
    with gr.Accordion("Exclude an annotator from training (admin)", open=False):
        with gr.Row():
            pick = gr.Dropdown([], label="Annotator", scale=2)
            exclude = gr.Button("Exclude", variant="stop", scale=1)
            include = gr.Button("Include again", scale=1)
        question = build_question("Yes, exclude")
        status = gr.Markdown()
    return {"pick": pick, "exclude": exclude, "include": include, "exclude_question": question,
            "exclude_status": status}


def _export() -> dict:
    with gr.Accordion("Export (admin)", open=False):
        with gr.Row():
            fmt = gr.Dropdown(list(FORMATS), value="jsonl", label="Format", scale=2)
            run = gr.Button("Export", scale=1)
            download = gr.DownloadButton("Download", visible=False, scale=1)
        status = gr.Markdown(EXPORT_NOTE)
    return {"fmt": fmt, "run": run, "download": download, "export_status": status}


def _tokens() -> dict:
    with gr.Accordion("API tokens (admin)", open=False):
        with gr.Row():
            parts = {"token_user": gr.Textbox(label="User", max_length=64),
                     "token_label": gr.Textbox(label="Label (optional)", max_length=200),
                     "token_days": gr.Number(label="Expires in days (blank = never)", minimum=0),
                     "token_button": gr.Button("Create token")}
        parts["token_out"] = gr.Markdown()
        parts["token_box"] = gr.Textbox(label="New token (shown once)", visible=False, interactive=False,
                                        buttons=["copy"], elem_id="new-token")
        parts["tokens"] = gr.Dataframe(label="Tokens (no secrets)", interactive=False)
        with gr.Row():
            parts["revoke_id"] = gr.Number(label="Token id", precision=0, scale=1)
            parts["revoke_button"] = gr.Button("Revoke", variant="stop", scale=1)
        parts["revoke_question"] = build_question("Yes, revoke")
    return parts


def layout_data(services: Services) -> DataParts:
    """Lay out the tab (inside ``with gr.Tab(...)``): the feedback, its quality, then the admin tools (the agents
    panel binds its own handlers; its buttons join ``admin_only``)."""
    feedback, quality = _feedback(services), _quality()
    access = gr.Markdown(ADMIN_NOTE)
    exclusion = _exclusion()
    with gr.Accordion("Flagged replies (admin)", open=False):
        flagged = gr.Dataframe(label="Replies with flags, most flagged first", interactive=False, wrap=True)
    export = _export()
    admin_only = [exclusion["exclude"], exclusion["include"], export["run"]]
    with gr.Accordion("Agents (admin)", open=False):
        build_agents_panel(services, admin_only)
    tokens = _tokens()
    admin_only += [tokens["token_button"], tokens["revoke_button"]]
    return DataParts(**feedback, **quality, access=access, **exclusion, flagged=flagged, **export, **tokens,
                     admin_only=admin_only)
