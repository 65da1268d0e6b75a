"""What the llama.cpp backend tries for a config, found without loading llama.cpp (its native library is for the
engine's own process): is llama-cpp-python installed, which GGUF and tokenizer serve the base, and its two loads
(as built, and the safe load that does not repack weights into extra buffer types such as AMX, whose kernels
fault on some virtual machines). The registry line is ``rlhf.registry.ENGINES["llama_cpp"]``.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path
from typing import Optional

from rlhf.serving.interface import EngineUnavailable
from rlhf.serving.spawn import EngineSpec

NAME = "llama_cpp"
LABEL = "llama.cpp"
SAFE_LABEL = "llama.cpp, safe load (weights not repacked for AMX)"


def llama_cpp_installed() -> bool:
    """True when llama-cpp-python can be imported here (``make setup`` builds it). Finds the package without
    importing it: loading the native library is for the engine's own process."""
    return importlib.util.find_spec(NAME) is not None


def llama_build() -> str:
    """This llama-cpp-python build (version and its native libraries' sizes and times), hashed; found on disk,
    never imported here."""
    spec = importlib.util.find_spec(NAME)
    if spec is None or not spec.origin:
        return "none"
    lib = Path(spec.origin).parent / "lib"
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in lib.glob("*.so*") if p.is_file())
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return hashlib.sha256(json.dumps([version, str(lib), files]).encode()).hexdigest()[:16]


def gguf_files(source: str, data_dir: Optional[str], weights: str = "shipped") -> tuple[Path, str]:
    """(GGUF file, tokenizer source) llama.cpp serves for base model ``source``; EngineUnavailable when
    llama-cpp-python is missing or the model cannot be served by it."""
    from rlhf.serving.llama_cpp.base import llama_base

    if not llama_cpp_installed():
        raise EngineUnavailable("llama-cpp-python is not installed (`make setup` builds it)")
    return llama_base(source, data_dir, weights)


def llama_files(config) -> tuple[Path, str]:
    """(GGUF file, tokenizer source) llama.cpp serves for the config's base model (``gguf_files``)."""
    return gguf_files(config.base_model, str(config.data_path), config.serving.llama_weights)


def options(config) -> dict:
    """The llama.cpp engine's settings from the config (``weights`` picks the GGUF; the rest go to its factory)."""
    s = config.serving
    return {"weights": s.llama_weights, "kv_cache_tokens": max(s.kv_cache_tokens, s.max_context_tokens + 64),
            "max_contexts": s.llama_contexts, "max_batch_size": s.max_batch_size}


def specs(source: str, device: str, data_dir: Optional[str], tokenizer_source: Optional[str] = None, *,
          weights: str = "shipped", **settings) -> list[EngineSpec]:
    """llama.cpp as built, then its safe load, over the GGUF of ``source`` (``device`` is not used: llama.cpp
    decodes on the CPU; ``tokenizer_source`` neither: the GGUF decides its tokenizer); one spec with the reason
    when it cannot run here. ``settings`` go to ``rlhf.serving.llama_cpp.engine.build``."""
    try:
        gguf, tokenizer = gguf_files(source, data_dir, weights)
    except (EngineUnavailable, OSError) as exc:  # OSError: e.g. no room in the data dir for a converted base
        return [EngineSpec(NAME, {}, LABEL, unavailable=str(exc))]
    settings = {"gguf": str(gguf), "tokenizer_source": tokenizer, "cache_dir": data_dir, **settings}
    build = llama_build()
    return [EngineSpec(NAME, {**settings, "extra_buffers": True}, LABEL, build=build),
            EngineSpec(NAME, {**settings, "extra_buffers": False}, SAFE_LABEL, build=build)]
