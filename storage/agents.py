"""Agents: a name, a system prompt, generation defaults, guidelines and an optional chat template over one base
model. Each is created with its version 0 (the base, no adapter) active; the policies section of the Store holds
its later versions."""
from __future__ import annotations

from typing import Optional

from storage.errors import Conflict, InvalidInput, NotFound
from storage.records import Agent
from storage.util import check_slug, check_text, dumps, utcnow

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful, honest and concise assistant. Answer the user's question directly, "
    "say so when you are not sure, and keep replies short unless asked for detail."
)
TEMPLATE_CHARS = 32_000  # a chat template (Jinja) may be longer than a message: the longest common ones are ~10k


class AgentsMixin:
    """Methods of Store for agents."""

    # ---- agents ------------------------------------------------------------------------------
    def create_agent(self, name: str, system_prompt: str, base_model: str,
                     generation: Optional[dict] = None, chat_template: Optional[str] = None) -> Agent:
        """A new agent with its version 0 (the base model, no adapter) active; ``chat_template``: its own (checked by
        the caller: ``rlhf.prompting.check_template``), None or "" for the base model's."""
        name = check_slug(name, "agent name")
        system_prompt = check_text(system_prompt, "system prompt", self.max_text_chars, allow_empty=True)
        chat_template = self._template(chat_template)
        with self._tx() as db:
            if self._one("SELECT id FROM agents WHERE name = ?", [name]):
                raise Conflict(f"agent {name!r} already exists")
            now = utcnow()
            agent_id = self._insert(db, "agents", {
                "name": name, "system_prompt": system_prompt, "base_model": base_model,
                "generation": dumps(generation or {}), "chat_template": chat_template, "created": now,
                "updated": now})
            self._insert(db, "policies", {"agent_id": agent_id, "version": 0, "status": "active",
                                          "created": now, "config": dumps({"base_model": base_model})})
        return self.get_agent(agent_id)

    def update_agent(self, name: str, system_prompt: Optional[str] = None,
                     generation: Optional[dict] = None, guidelines: Optional[str] = None,
                     chat_template: Optional[str] = None) -> Agent:
        """Change an agent's system prompt, generation defaults, annotation guidelines or chat template ("" = back to
        the base model's); None leaves a field as it is; its versions stay."""
        agent = self.get_agent(name)
        if guidelines is not None:
            check_text(guidelines, "guidelines", self.max_text_chars, allow_empty=True)
        template = self._template(chat_template)
        with self._tx() as db:
            if chat_template is not None:
                db.execute("UPDATE agents SET chat_template = ?, updated = ? WHERE id = ?",
                           [template, utcnow(), agent.id])
            if guidelines is not None:
                db.execute("UPDATE agents SET guidelines = ?, updated = ? WHERE id = ?",
                           [guidelines, utcnow(), agent.id])
            if system_prompt is not None:
                check_text(system_prompt, "system prompt", self.max_text_chars, allow_empty=True)
                db.execute("UPDATE agents SET system_prompt = ?, updated = ? WHERE id = ?",
                           [system_prompt, utcnow(), agent.id])
            if generation is not None:
                db.execute("UPDATE agents SET generation = ?, updated = ? WHERE id = ?",
                           [dumps(generation), utcnow(), agent.id])
        return self.get_agent(agent.id)

    def _template(self, chat_template: Optional[str]) -> Optional[str]:
        """A chat template as stored: None for none (or an empty one), else within the text limit."""
        if not chat_template or not chat_template.strip():
            return None
        return check_text(chat_template, "chat template", TEMPLATE_CHARS)

    def ensure_default_agent(self, base_model: str, name: str = "assistant") -> Agent:
        """The default agent, created on first start."""
        row = self._one("SELECT id FROM agents WHERE name = ?", [name])
        if row:
            return self.get_agent(row["id"])
        try:
            return self.create_agent(name, DEFAULT_SYSTEM_PROMPT, base_model)
        except Conflict:  # another process created it meanwhile
            return self.get_agent(name)

    def get_agent(self, key: int | str | None = None) -> Agent:
        """An agent by id or name; None gives the first agent."""
        if key is None:
            row = self._one("SELECT * FROM agents ORDER BY id LIMIT 1")
        elif isinstance(key, int) and not isinstance(key, bool):
            row = self._one("SELECT * FROM agents WHERE id = ?", [key])
        elif isinstance(key, str):
            row = self._one("SELECT * FROM agents WHERE name = ?", [key])
        else:
            raise InvalidInput("agent must be a name or an id")
        if row is None:
            raise NotFound(f"unknown agent {key!r}" if key is not None else "no agents yet")
        return Agent.from_row(row)

    def list_agents(self) -> list[Agent]:
        return [Agent.from_row(r) for r in self._all("SELECT * FROM agents ORDER BY id")]
