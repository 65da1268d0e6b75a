"""A version's adapter as a GGUF LoRA file to carry with it (``rlhf.retrain.bundle``): the seam through which code
outside serving reaches the llama.cpp converter."""
from __future__ import annotations


def write_gguf_lora(adapter_dir, base_config: dict, out) -> None:
    """A PEFT adapter as a GGUF LoRA (llama.cpp's format) for a base of this ``config.json``, without the base's
    GGUF; EngineUnavailable for an architecture the converter does not take, AdapterError for an adapter it cannot."""
    from rlhf.serving.llama_cpp.convert import BaseInfo, lora_to_gguf

    lora_to_gguf(adapter_dir, BaseInfo.from_config(base_config), out)
