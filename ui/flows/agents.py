"""Agent actions as plain functions (no Gradio, no FastAPI), shared by the Data tab and the REST router."""
from __future__ import annotations

from typing import Optional

from rlhf.base_models import ModelNotFound, resolve_model
from rlhf.serving.policy_server import GenParams
from storage import InvalidInput
from storage.util import check_slug
from ui.services import Services

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
    """The base model of a new agent: the app's when not given; a name the model loader can find."""
    base = base_model or services.config.base_model
    try:
        resolve_model(base, services.config.data_path)
    except ModelNotFound as exc:
        raise InvalidInput(str(exc)) from None
    return base


def create_agent(services: Services, name: str, system_prompt: str, base_model: Optional[str] = None,
                 generation: Optional[dict] = None):
    """A new agent (version 0 = its base model) after validating its base model and generation defaults."""
    check_slug(name, "agent name")  # before the base model is looked for: a bad name fails at once
    base = check_base_model(services, base_model)
    return services.store.create_agent(name, system_prompt, base, check_generation(services, generation))


def agent_json(services: Services, agent) -> dict:
    return agent.to_dict() | {"active_policy_id": services.store.active_policy(agent.id).id}
