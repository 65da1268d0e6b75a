"""Agents panel (admin): create an agent (name, system prompt, base model, generation defaults, guidelines, its own
chat template) or edit one.

Each agent has its own version line and leaderboard. An agent on another base model than the app's is
served by its own model server, loaded on its first chat (``Services.server_for``).
"""
from __future__ import annotations

from typing import Optional

import gradio as gr

from ui.permissions import require_admin
from ui.flows.agents import base_status, check_chat_template, check_generation, create_agent
from ui.services import Services, bind
from ui.tabs.errors import handles_errors

NEW = "➕ new agent"


def generation_of(max_new_tokens, temperature, top_p) -> dict:
    """Generation defaults from the form (blank fields are left to the app's defaults)."""
    out = {}
    for key, value, cast in (("max_new_tokens", max_new_tokens, int), ("temperature", temperature, float),
                             ("top_p", top_p, float)):
        if value not in (None, ""):
            out[key] = cast(value)
    return out


def agent_choices(services: Services) -> list[str]:
    return [NEW] + [a.name for a in services.store.list_agents()]


def load_agent(services: Services, pick: str):
    """The form filled with the picked agent (empty for a new one; the base model is fixed once created)."""
    if pick in (None, NEW):
        return "", "", gr.Textbox(value=services.config.base_model, interactive=True), None, None, None, "", ""
    a = services.store.get_agent(pick)
    g = a.generation or {}
    return (a.name, a.system_prompt, gr.Textbox(value=a.base_model, interactive=False), g.get("max_new_tokens"),
            g.get("temperature"), g.get("top_p"), a.guidelines, a.chat_template or "")


@handles_errors(lambda status: (gr.Dropdown(), status), also=(ValueError,))
def save_agent(services: Services, pick: str, name: str, system_prompt: str, base_model: str, max_new_tokens,
               temperature, top_p, request: gr.Request = None, guidelines: str = "", template: str = ""):
    """Create the agent (when "new" is picked) or save the picked agent's system prompt, defaults, guidelines and
    chat template (blank: the base model's)."""
    require_admin(services, request)
    generation = generation_of(max_new_tokens, temperature, top_p)
    if pick in (None, NEW):
        agent = create_agent(services, (name or "").strip(), system_prompt or "", (base_model or "").strip() or None,
                             generation, template or None)
        if guidelines:
            agent = services.store.update_agent(agent.name, guidelines=guidelines)
        message = f"Created agent **{agent.name}** on `{agent.base_model}` (version 0 = the base model)."
        ready = base_status(services, agent)
        if ready["status"] != "ready":
            message += (f" Its base model is being prepared in the background (job #{ready['prepare_job_id']}: the "
                        "Training tab shows its progress); it chats once that is done.")
    else:
        agent = services.store.update_agent(pick, system_prompt or "", check_generation(services, generation),
                                            guidelines or "", check_chat_template(template or ""))
        message = (f"Saved agent **{agent.name}**: new conversations use the new system prompt and defaults; "
                   "annotators see the guidelines in Chat, Arena and Vote.")
    return gr.Dropdown(choices=agent_choices(services), value=agent.name), message


def build_agents_panel(services: Services, admin_only: Optional[list] = None) -> None:
    """Lay out the panel and bind its handlers; its buttons are appended to ``admin_only``."""
    with gr.Row():
        pick = gr.Dropdown(agent_choices(services), value=NEW, label="Agent", scale=1)
        name = gr.Textbox(label="Name", max_length=64, scale=1)
        base = gr.Textbox(label="Base model (shipped name, hub id or local dir)", value=services.config.base_model,
                          scale=2)
    prompt = gr.Textbox(label="System prompt", lines=3)  # the Store refuses an over-long one with a reason
    with gr.Row():
        max_tokens = gr.Number(label="Max new tokens (blank = app default)", precision=0)
        temperature = gr.Number(label="Temperature (blank = default)")
        top_p = gr.Number(label="Top-p (blank = default)")
    guidelines = gr.Textbox(label="Annotation guidelines (Markdown): what a good reply is, when to flag, how to vote",
                            lines=5, placeholder="e.g. Prefer short, correct replies. Flag anything unsafe. Vote "
                            "*Both bad* when neither answers the question.")
    with gr.Accordion("Chat template (advanced)", open=False):
        template = gr.Textbox(label="Chat template (Jinja, as in tokenizer_config.json; blank = the base model's, or "
                              "plain 'role: text' lines for a base without one)", lines=6, max_lines=20,
                              placeholder="{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                              "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    save = gr.Button("Save agent", variant="primary")
    status = gr.Markdown("Pick an agent to edit it, or fill in the form to create one.")
    if admin_only is not None:
        admin_only.append(save)
    pick.change(bind(load_agent, services), [pick],
                [name, prompt, base, max_tokens, temperature, top_p, guidelines, template], api_name=False)
    pick.focus(lambda current: gr.Dropdown(choices=agent_choices(services), value=current), [pick], [pick],
               api_name=False)
    save.click(bind(save_agent, services),
               [pick, name, prompt, base, max_tokens, temperature, top_p, guidelines, template], [pick, status],
               api_name="save_agent")
