"""The app's registries, as light tables of ``name -> import path``: what ships of each kind, in one module that
imports nothing of what it names. The config check reads them to validate names, and each seam imports an entry's
module only when it is used, so ``rlhf.config`` never imports serving or training code to know their names.

* ``JOB_KINDS``: job kind -> ``"module:function"``, ``fn(ctx: JobContext) -> result dict`` (``rlhf.jobs.kinds``).
  Kinds that do not ship with the app (a plugin's, a test's) are named in the server's config,
  ``scheduler.job_kinds``.
* ``METHODS``: ``retrain.method`` -> ``"module:attribute"`` of its ``PolicyMethod`` (``rlhf.training.methods``).
* ``REWARD_KINDS``: ``reward.method`` -> ``"module:attribute"`` of its ``RewardKind``
  (``rlhf.training.reward_kinds``).
* ``ENGINES``: ``serving.engine`` -> ``Backend``, in the order ``serving.engine: auto`` tries them
  (``rlhf.serving.interface``).

A new job kind, policy method, reward-model kind or serving backend is its own module plus one line here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

JOB_KINDS = {
    "retrain": "rlhf.retrain.pipeline:retrain",
    "eval_samples": "rlhf.retrain.pipeline:eval_samples",
    "prepare_base": "rlhf.base_models:prepare_base",
}

METHODS = {
    "ppo": "rlhf.training.methods.ppo:METHOD",
    "dpo": "rlhf.training.methods.dpo:METHOD",
    "rpo": "rlhf.training.methods.rpo:METHOD",
    "online_dpo": "rlhf.training.methods.online_dpo:METHOD",
}

REWARD_KINDS = {
    "head": "rlhf.training.reward_head_kind:KIND",
    "lora": "rlhf.training.reward_lora:KIND",
}


@dataclass(frozen=True)
class Backend:
    """One serving backend by import paths (the registry imports nothing). ``core``: ``"module:factory"``, keyword
    settings (``EngineSpec.settings``) -> ``EngineCore``, run in the engine's process. ``specs``: its light module
    with ``options(config) -> dict`` and ``specs(source, device, data_dir, tokenizer_source=None, **options) ->
    list[EngineSpec]`` (a spec that cannot run here says why in ``unavailable``). ``auto_devices``: where
    ``serving.engine: auto`` tries it (None: everywhere)."""

    core: str
    specs: str
    auto_devices: Optional[tuple[str, ...]] = None


ENGINES = {
    "llama_cpp": Backend("rlhf.serving.llama_cpp.engine:build", "rlhf.serving.llama_cpp.spec", ("cpu",)),
    "transformers": Backend("rlhf.serving.transformers.engine:build", "rlhf.serving.transformers.spec"),
}
ENGINE_CHOICES = ("auto", *ENGINES)
