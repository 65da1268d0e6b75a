"""What a version's folder holds beside its PEFT adapter, so that it travels whole: the tokenizer with the chat
template the app encoded its prompts with (``rlhf.prompting.chat_template``: the base's, an agent's own, or the
plain lines of a base without one), and the adapter as a GGUF LoRA for llama.cpp.

``AutoTokenizer.from_pretrained(version_dir)`` then templates a chat exactly as the app did, and
``llama-cli -m base.gguf --lora adapter_model.gguf`` serves the version without the app's converter.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
GGUF_LORA = "adapter_model.gguf"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model")


def add_tokenizer(folder: Path, base_source: str, template: Optional[str] = None) -> None:
    """Save the base's tokenizer into ``folder`` with the chat template the app encodes this agent's chats with."""
    from transformers import AutoTokenizer

    from rlhf.prompting import chat_template

    tok = AutoTokenizer.from_pretrained(base_source)
    tok.chat_template = chat_template(tok, template)
    tok.save_pretrained(str(folder))


def add_gguf_lora(folder: Path, base_source: str) -> Optional[str]:
    """Write the adapter in ``folder`` as ``adapter_model.gguf``; the reason when it cannot be (None when written)."""
    from transformers import AutoConfig

    from rlhf.serving.gguf_lora import write_gguf_lora
    from rlhf.serving.interface import AdapterError, EngineUnavailable

    try:
        write_gguf_lora(folder, AutoConfig.from_pretrained(base_source).to_dict(), folder / GGUF_LORA)
    except (AdapterError, EngineUnavailable) as exc:
        (folder / GGUF_LORA).unlink(missing_ok=True)
        return str(exc)
    return None


def complete(folder: Path, base_source: str, template: Optional[str] = None) -> dict:
    """Add the tokenizer and the GGUF LoRA to a version folder; what was added (and why the GGUF LoRA was not)."""
    folder = Path(folder)
    add_tokenizer(folder, base_source, template)
    why_not = add_gguf_lora(folder, base_source)
    if why_not:
        log.info("no GGUF LoRA beside the adapter in %s: %s", folder, why_not)
    return {"tokenizer": True, "gguf_lora": why_not is None, **({"gguf_lora_missing": why_not} if why_not else {})}


def travel_files(folder: Path) -> list[Path]:
    """The files of a version folder that go with it (adapter, tokenizer, GGUF LoRA), not the app's own."""
    names = (*ADAPTER_FILES, *TOKENIZER_FILES, GGUF_LORA)
    return [Path(folder) / n for n in names if (Path(folder) / n).is_file()]


def has_tokenizer(folder: Path) -> bool:
    """True when the folder holds a saved tokenizer (versions published before bundles did not)."""
    try:
        return bool(json.loads((Path(folder) / "tokenizer_config.json").read_text()))
    except (OSError, ValueError):
        return False
