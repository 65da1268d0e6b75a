"""Agent actions as plain functions (no Gradio, no FastAPI), shared by the Data tab and the REST router."""
from __future__ import annotations

from typing import Optional

from rlhf.base_models import ModelNotFound, needs_conversion, resolve_model
from rlhf.prompting import check_template
from rlhf.serving.policy_server import GenParams
from storage import InvalidInput
from storage.util import check_slug
from ui.services import Services, prepare_job

GENERATION_KEYS = ("max_new_tokens", "temperature", "top_p", "seed")


def check_generation(services: Services, generation: Optional[dict]) -> Optional[dict]:
    """Generation defaults an agent may carry (known keys, valid values), or InvalidInput."""
    if generation is None:
        return None
    unknown = sorted(set(generation) - set(GENERATION_KEYS))
    if unknown:
        raise InvalidInput(f"unknown generation keys {unknown}; allowed: {list(GENERATION_KEYS)}")
    cfg = services.config.serving
    try:
        GenParams(**{"max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature, "top_p": cfg.top_p,
                     "seed": None, **generation}).validated()
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"generation: {exc}") from None
    return dict(generation)


def check_base_model(services: Services, base_model: Optional[str]) -> str:
    """The base model of a new agent: the app's when not given; a name the model loader can find (a GGUF that needs
    converting is found, and converted later by a job: ``prepare``)."""
    base = base_model or services.config.base_model
    try:
        if not needs_conversion(base, services.config.data_path):
            resolve_model(base, services.config.data_path)
    except ModelNotFound as exc:
        raise InvalidInput(str(exc)) from None
    return base


def check_chat_template(template: Optional[str]) -> Optional[str]:
    """An agent's own chat template when it renders a chat (``rlhf.prompting.check_template``); None and "" (the base
    model's) pass as they are; InvalidInput with the reason otherwise."""
    if not template or not template.strip():
        return template
    try:
        return check_template(template)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def create_agent(services: Services, name: str, system_prompt: str, base_model: Optional[str] = None,
                 generation: Optional[dict] = None, chat_template: Optional[str] = None):
    """A new agent (version 0 = its base model) after validating its base model, generation defaults and chat
    template."""
    check_slug(name, "agent name")  # before the base model is looked for: a bad name fails at once
    template = check_chat_template(chat_template)
    base = check_base_model(services, base_model)
    agent = services.store.create_agent(name, system_prompt, base, check_generation(services, generation), template)
    prepare(services, agent)
    return agent


def prepare(services: Services, agent) -> None:
    """Queue the conversion of the agent's base model when it needs one (a GGUF: minutes for a large model), so the
    request that created the agent answers at once; chats wait for the job (``Services.server_for``)."""
    if services.scheduler is not None and needs_conversion(agent.base_model, services.config.data_path):
        services.scheduler.enqueue("prepare_base", agent.name, reason="new agent")


def base_status(services: Services, agent) -> dict:
    """Whether the agent's base model is ready to chat: ``status`` ready | preparing (its ``prepare_base`` job is
    queued or running) | failed (that job failed: chats say why) | unprepared (no job yet: the first chat queues one),
    and the job's id."""
    if not needs_conversion(agent.base_model, services.config.data_path):
        return {"status": "ready", "prepare_job_id": None}
    job = prepare_job(services.store, agent.id)
    if job is None:
        return {"status": "unprepared", "prepare_job_id": None}
    return {"status": {"queued": "preparing", "running": "preparing", "failed": "failed"}.get(job.status, "unprepared"),
            "prepare_job_id": job.id}


def agent_json(services: Services, agent) -> dict:
    return agent.to_dict() | {"active_policy_id": services.store.active_policy(agent.id).id} | \
        base_status(services, agent)
