"""What the transformers backend tries for a config: one spec, the base model's torch weights on the device (it
runs wherever torch does, so it is never unavailable before it is tried). The registry line is
``rlhf.registry.ENGINES["transformers"]``; nothing heavy is imported here.
"""
from __future__ import annotations

from typing import Optional

from rlhf.serving.spawn import EngineSpec

NAME = "transformers"


def options(config) -> dict:
    """The transformers engine's settings from the config."""
    s = config.serving
    return {"load_in_4bit": s.load_in_4bit, "max_batch_size": s.max_batch_size}


def specs(source: str, device: str, data_dir: Optional[str], tokenizer_source: Optional[str] = None,
          **settings) -> list[EngineSpec]:
    """The base ``source`` (a shipped name is converted once under ``data_dir``) on ``device``, with the tokenizer
    of ``tokenizer_source`` (None: the model's own). ``settings`` go to ``rlhf.serving.transformers.engine.build``."""
    label = NAME if device == "cpu" else f"{NAME} ({device})"
    return [EngineSpec(NAME, {"model_source": source, "data_dir": data_dir, "device": device,
                              "tokenizer_source": tokenizer_source, **settings}, label)]
