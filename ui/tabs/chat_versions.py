"""What the Chat tab's pickers follow in the Store while a page is open: agents, versions (and promotions), the
guidelines, and who sees the version picker."""
from __future__ import annotations

import gradio as gr

from ui.permissions import is_admin
from ui.services import Services
from ui.tabs.common import guidelines_markdown

ACTIVE = "active"  # the version choice that follows promotions


def version_choices(store, agent_name: str) -> tuple[list[tuple[str, object]], str]:
    """Dropdown choices: "the active version" (follows promotions), then each servable version by id (pinned)."""
    policies = [p for p in store.list_policies(agent_name) if p.status in ("active", "candidate")]
    active = store.active_policy(agent_name)
    pinned = [(f"v{p.version} only" + (" · base" if p.is_base else ""), p.id) for p in reversed(policies)]
    return [(f"Active version (now v{active.version})", ACTIVE)] + pinned, ACTIVE


def refresh_versions(services: Services, agent_name: str, current=None):
    """Version dropdown for an agent (picks up versions published and promoted while the page is open): the
    "active version" choice follows a promotion; a pinned version stays pinned while it is servable."""
    choices, active = version_choices(services.store, agent_name)
    keep = current if current in [c[1] for c in choices] else active
    return gr.Dropdown(choices=choices, value=keep)


def refresh_agents(services: Services, current: str):
    """Agent dropdown with agents created since the page loaded (keeps the pick)."""
    return gr.Dropdown(choices=[a.name for a in services.store.list_agents()], value=current)


def follow_store(services: Services, agent_name: str, version, guide: str):
    """What an open page picks up from the Store on its timer: versions (and promotions) and the guidelines."""
    text = guidelines_markdown(services, agent_name)
    return refresh_versions(services, agent_name, version), (gr.skip() if text == guide else text)


def show_picker(services: Services, request: gr.Request = None):
    """The version picker is for admins (and local mode); annotators chat with the active version."""
    return gr.Dropdown(visible=is_admin(services, request))
