"""GGUF files for llama.cpp, written with the ``gguf`` package: a version's PEFT LoRA adapter, and (once per base)
a Llama-family Hugging Face model directory.

Layout facts this relies on (llama.cpp's own converter and loader agree on them):

* A matrix ``W`` of PyTorch shape (out, in) is stored as is; GGUF lists its dims reversed (``ne = [in, out]``).
* LoRA: ``lora_a`` is PEFT's ``lora_A.weight`` (r, in) and ``lora_b`` is ``lora_B.weight`` (out, r); llama.cpp adds
  ``scale * B (A x)`` with ``scale = alpha / r`` when ``adapter.lora.alpha`` is non-zero, else 1. We write alpha 0
  and fold each module's own PEFT scaling into ``B``, so rsLoRA, ``rank_pattern`` and ``alpha_pattern`` all come
  out exact.
* Llama's rotary embedding: Hugging Face rotates the two halves of each head (``rotate_half``); llama.cpp's
  ``llama`` architecture rotates adjacent pairs. So the output rows of ``q_proj`` and ``k_proj`` are permuted
  per head (``_permute``), in the base weights and in LoRA ``B`` alike (``A`` acts on inputs and is unchanged).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from rlhf.serving.adapter_patterns import scaling
from rlhf.serving.interface import AdapterError, EngineUnavailable

# Hugging Face Llama module name -> llama.cpp tensor name (per block unless marked).
BLOCK_TENSORS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
                 "post_attention_layernorm": "ffn_norm"}
QUANTIZED = ("q8_0", "q4_0")  # block types the converter writes (block 32); anything else: f16 / f32
PERMUTED_ARCHS = {"llama"}  # architectures whose q/k rows llama.cpp expects in pair-rotation order
_LORA_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.((?:self_attn|mlp)\.\w+)\.lora_([AB])\.weight$")
_LM_HEAD_KEY = re.compile(r"(?:^|\.)lm_head\.lora_([AB])\.weight$")


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of a q/k projection (out, ...) from half-rotation to pair-rotation order, per head."""
    out = w.shape[0]
    return w.reshape(n_head, 2, out // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclass
class BaseInfo:
    """What a LoRA conversion needs to know about the base GGUF: architecture, heads, and tensor shapes."""

    arch: str
    n_head: int
    n_head_kv: int
    shapes: dict = field(default_factory=dict)  # tensor name -> ne (GGUF order: [in, out])

    @classmethod
    def read(cls, path: str | Path) -> "BaseInfo":
        """From the GGUF's header alone (``rlhf.gguf_header``: its vocabulary is stepped over, not decoded)."""
        from rlhf.gguf_header import read_fields, read_header

        arch = read_fields(path, ["general.architecture"]).get("general.architecture")
        keys = [f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"]
        fields, shapes = read_header(path, keys)
        heads = int(fields.get(keys[0]) or 0)
        return cls(arch, heads, int(fields.get(keys[1], heads)), shapes)

    @classmethod
    def from_config(cls, cfg: dict) -> "BaseInfo":
        """What ``hf_to_gguf`` would write for a model of this ``config.json`` (a GGUF LoRA needs no base GGUF);
        EngineUnavailable for an architecture it does not convert."""
        if cfg.get("model_type") != "llama":
            raise EngineUnavailable(f"llama.cpp LoRA conversion here takes Llama-architecture bases only (model_type "
                                    f"{cfg.get('model_type')!r})")
        n_embd, n_head, ff = int(cfg["hidden_size"]), int(cfg["num_attention_heads"]), int(cfg["intermediate_size"])
        n_kv = int(cfg.get("num_key_value_heads") or n_head)
        head_dim = int(cfg.get("head_dim") or n_embd // n_head)
        block = {"attn_q": [n_embd, n_head * head_dim], "attn_k": [n_embd, n_kv * head_dim],
                 "attn_v": [n_embd, n_kv * head_dim], "attn_output": [n_head * head_dim, n_embd],
                 "ffn_gate": [n_embd, ff], "ffn_up": [n_embd, ff], "ffn_down": [ff, n_embd]}
        shapes = {f"blk.{i}.{name}.weight": ne for i in range(int(cfg["num_hidden_layers"]))
                  for name, ne in block.items()}
        if not cfg.get("tie_word_embeddings", False):
            shapes["output.weight"] = [n_embd, int(cfg["vocab_size"])]
        return cls("llama", n_head, n_kv, shapes)


def _read_adapter(adapter_dir: Path) -> tuple[dict, dict]:
    """(adapter_config.json, tensors as float32 numpy) of a PEFT adapter dir; AdapterError when unreadable."""
    config_path = adapter_dir / "adapter_config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"cannot read {config_path}: {exc}") from exc
    st, binary = adapter_dir / "adapter_model.safetensors", adapter_dir / "adapter_model.bin"
    try:
        import torch

        if st.is_file():
            from safetensors.torch import load_file

            state = load_file(str(st))
        elif binary.is_file():
            state = torch.load(str(binary), map_location="cpu", weights_only=True)
        else:
            raise AdapterError(f"{adapter_dir} has no adapter_model.safetensors or adapter_model.bin")
        return config, {k: v.float().numpy() for k, v in state.items()}
    except AdapterError:
        raise
    except Exception as exc:  # a truncated or corrupted file raises many kinds of errors
        raise AdapterError(f"cannot read the weights in {adapter_dir}: {type(exc).__name__}: {exc}") from exc


def _check_supported(config: dict) -> None:
    problems = []
    if config.get("peft_type", "LORA") != "LORA":
        problems.append(f"peft_type {config.get('peft_type')}")
    if config.get("use_dora"):
        problems.append("DoRA")
    if config.get("bias", "none") != "none":
        problems.append(f"bias={config.get('bias')}")
    if config.get("modules_to_save"):
        problems.append(f"modules_to_save={config.get('modules_to_save')}")
    if config.get("fan_in_fan_out"):
        problems.append("fan_in_fan_out")
    if problems:
        raise AdapterError(f"llama.cpp cannot serve this adapter: {', '.join(problems)} is not supported")


def lora_to_gguf(adapter_dir: str | Path, base: BaseInfo, out: str | Path, dtype: str = "f16") -> Path:
    """Write a PEFT LoRA adapter as a GGUF LoRA for the base described by ``base``; AdapterError when it cannot be
    (unsupported options, a module llama.cpp does not have, shapes that do not fit the base)."""
    import gguf

    adapter_dir, out = Path(adapter_dir), Path(out)
    config, state = _read_adapter(adapter_dir)
    _check_supported(config)
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, value in state.items():
        m, h = _LORA_KEY.search(key), _LM_HEAD_KEY.search(key)
        if m is not None and m.group(2) in BLOCK_TENSORS:
            name, module, side = f"blk.{m.group(1)}.{BLOCK_TENSORS[m.group(2)]}", m.group(2), m.group(3)
        elif h is not None:
            name, module, side = "output", "lm_head", h.group(1)
        else:
            raise AdapterError(f"llama.cpp cannot serve this adapter: no llama.cpp tensor for {key!r}")
        pairs.setdefault(name, {"module": module})[side] = value
    if not pairs:
        raise AdapterError(f"{adapter_dir} holds no LoRA weights")
    np_dtype = np.float16 if dtype == "f16" else np.float32
    writer = gguf.GGUFWriter(str(out), base.arch)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", 0.0)  # scale 1: each module's PEFT scaling is folded into B
    for name in sorted(pairs):
        pair = pairs[name]
        if "A" not in pair or "B" not in pair:
            raise AdapterError(f"adapter tensor {name} lacks its lora_A or lora_B half")
        a, b = pair["A"], pair["B"]
        target = base.shapes.get(f"{name}.weight")
        if target is None and name == "output":  # tied embeddings: llama.cpp has no output tensor to adapt
            raise AdapterError("llama.cpp cannot serve a LoRA on lm_head of a model with tied embeddings")
        if target is None:
            raise AdapterError(f"the base model has no tensor {name}.weight for this adapter")
        if a.shape[1] != target[0] or b.shape[0] != target[1] or a.shape[0] != b.shape[1]:
            raise AdapterError(f"adapter tensor {name} has shapes A{a.shape} B{b.shape}, which do not fit the base "
                               f"weight {target[::-1]} (out, in): wrong base model?")
        b = b * scaling(config, pair["module"], a.shape[0])  # bounded pattern match: AdapterError, never a stall
        if base.arch in PERMUTED_ARCHS and pair["module"] in ("self_attn.q_proj", "self_attn.k_proj"):
            b = _permute(b, base.n_head if pair["module"] == "self_attn.q_proj" else base.n_head_kv)
        writer.add_tensor(f"{name}.weight.lora_a", np.ascontiguousarray(a, dtype=np_dtype))
        writer.add_tensor(f"{name}.weight.lora_b", np.ascontiguousarray(b, dtype=np_dtype))
    _write(writer)
    return out


def _write(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# ---- a Hugging Face model directory as a base GGUF -------------------------------------------------------------
def _tokenizer_metadata(writer, model_dir: Path, vocab_size: int) -> None:
    """Every tokenizer field llama.cpp reads, so that it splits text into the ids transformers gives (byte-level
    BPE, as GPT-2, SmolLM, Llama 3 and Qwen2 use): vocabulary, token types, merges, the pre-tokenizer named by
    llama.cpp's fingerprint of the tokenizer, special ids, whether BOS/EOS are added, and the chat template."""
    from rlhf.serving.llama_cpp.pretokenizer import pre_tokenizer_name

    path = model_dir / "tokenizer.json"
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EngineUnavailable(f"{model_dir} has no readable tokenizer.json ({exc})") from exc
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise EngineUnavailable(f"{model_dir}: only byte-level BPE tokenizers convert here (found "
                                f"{model.get('type')!r}); convert the model with llama.cpp's convert_hf_to_gguf.py "
                                f"and set base_model to the .gguf file")
    tok = _hf_tokenizer(model_dir)
    pre = pre_tokenizer_name(tok)
    if pre is None:
        raise EngineUnavailable(f"{model_dir}: llama.cpp knows no pre-tokenizer that splits text as this tokenizer "
                                f"does, so it would see other tokens than transformers; convert the model with "
                                f"llama.cpp's convert_hf_to_gguf.py and set base_model to the .gguf file")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf_token_type("unused")] * vocab_size
    for text, i in model["vocab"].items():
        if i < vocab_size:
            tokens[i], types[i] = text, gguf_token_type("normal")
    for added in spec.get("added_tokens") or []:
        if added["id"] < vocab_size:
            tokens[added["id"]] = added["content"]
            types[added["id"]] = gguf_token_type("control" if added.get("special") else "user")
    template = _chat_template(model_dir)
    if template:
        writer.add_chat_template(template)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    _special_ids(writer, tok, json.loads((model_dir / "config.json").read_text()))


def _hf_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError) as exc:
        raise EngineUnavailable(f"cannot load the tokenizer in {model_dir}: {exc}") from exc


def _special_ids(writer, tok, cfg: dict) -> None:
    """BOS/EOS/PAD/UNK ids (the tokenizer's, else the model config's) and whether encoding adds BOS/EOS, as
    transformers does: llama.cpp's own defaults differ per pre-tokenizer (e.g. "llama-bpe" adds BOS)."""
    for name, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                      ("pad", writer.add_pad_token_id), ("unk", writer.add_unk_token_id)):
        value = getattr(tok, f"{name}_token_id", None)
        if value is None:
            value = cfg.get(f"{name}_token_id")
            value = value[0] if isinstance(value, list) and value else value
        if isinstance(value, int):
            add(value)
    plain, full = tok.encode("a", add_special_tokens=False), tok.encode("a")
    writer.add_add_bos_token(len(full) > len(plain) and full[0] == tok.bos_token_id)
    writer.add_add_eos_token(len(full) > len(plain) and full[-1] == tok.eos_token_id)


def _chat_template(model_dir: Path) -> Optional[str]:
    """The model's chat template (``chat_template.jinja``, or the key in ``tokenizer_config.json``)."""
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    try:
        template = json.loads((model_dir / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError):
        return None
    return template if isinstance(template, str) else None


def gguf_token_type(kind: str) -> int:
    import gguf

    return {"normal": gguf.TokenType.NORMAL, "control": gguf.TokenType.CONTROL,
            "user": gguf.TokenType.USER_DEFINED, "unused": gguf.TokenType.UNUSED}[kind]


def _matrix(writer, name: str, w: np.ndarray, weight_type: str) -> None:
    import gguf

    if weight_type in QUANTIZED and w.shape[-1] % 32 == 0:
        kind = getattr(gguf.GGMLQuantizationType, weight_type.upper())
        q = gguf.quants.quantize(w.astype(np.float32), kind)
        writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=kind)
    elif weight_type == "f32":
        writer.add_tensor(name, w.astype(np.float32))
    else:
        writer.add_tensor(name, w.astype(np.float16))


def hf_to_gguf(model_dir: str | Path, out: str | Path, weight_type: str = "q8_0") -> Path:
    """Convert a Llama-architecture Hugging Face model directory (safetensors) to a GGUF base for llama.cpp;
    EngineUnavailable for other architectures or tokenizers (convert those with llama.cpp's own script)."""
    import gguf
    from safetensors.numpy import load_file

    model_dir, out = Path(model_dir), Path(out)
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("model_type") != "llama":
        raise EngineUnavailable(f"{model_dir}: only Llama-architecture directories convert here (model_type "
                                f"{cfg.get('model_type')!r}); convert it with llama.cpp's convert_hf_to_gguf.py "
                                f"and set base_model to the .gguf file")
    n_embd, n_head = cfg["hidden_size"], cfg["num_attention_heads"]
    n_head_kv = cfg.get("num_key_value_heads") or n_head
    head_dim = cfg.get("head_dim") or n_embd // n_head
    if head_dim * n_head != n_embd or cfg.get("rope_scaling") or cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise EngineUnavailable(f"{model_dir}: head_dim, rope_scaling or biases not supported by this converter")
    state = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(str(shard)))
    if not state:
        raise EngineUnavailable(f"{model_dir} has no safetensors weights")
    state = {k.removeprefix("model."): v for k, v in state.items()}
    vocab = state["embed_tokens.weight"].shape[0]
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(model_dir.name)
    writer.add_context_length(int(cfg.get("max_position_embeddings", 2048)))
    writer.add_embedding_length(n_embd)
    writer.add_block_count(int(cfg["num_hidden_layers"]))
    writer.add_feed_forward_length(int(cfg["intermediate_size"]))
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta")
                                    or 10000.0))
    writer.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(vocab)
    writer.add_file_type({"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
                          "f32": gguf.LlamaFileType.ALL_F32}.get(weight_type, gguf.LlamaFileType.MOSTLY_F16))
    _tokenizer_metadata(writer, model_dir, vocab)
    _matrix(writer, "token_embd.weight", state["embed_tokens.weight"], weight_type)
    writer.add_tensor("output_norm.weight", state["norm.weight"].astype(np.float32))
    if "lm_head.weight" in state and not cfg.get("tie_word_embeddings", False):
        _matrix(writer, "output.weight", state["lm_head.weight"], weight_type)
    for i in range(int(cfg["num_hidden_layers"])):
        for module, name in BLOCK_TENSORS.items():
            w = state[f"layers.{i}.{module}.weight"]
            if module == "self_attn.q_proj":
                w = _permute(w, n_head)
            elif module == "self_attn.k_proj":
                w = _permute(w, n_head_kv)
            if w.ndim == 1:
                writer.add_tensor(f"blk.{i}.{name}.weight", w.astype(np.float32))
            else:
                _matrix(writer, f"blk.{i}.{name}.weight", w, weight_type)
    _write(writer)
    return out


def adapter_fingerprint(adapter_dir: str | Path) -> str:
    """A short hash of an adapter's files (config + weights): the cache key of its GGUF."""
    import hashlib

    h = hashlib.sha256()
    adapter_dir = Path(adapter_dir)
    for name in ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"):
        p = adapter_dir / name
        if p.is_file():
            h.update(name.encode())
            with p.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()[:20]


def model_fingerprint(path: str | Path, extra: Optional[str] = None) -> str:
    """A short hash naming a converted base: the source dir's config and weight file sizes and mtimes."""
    import hashlib

    path = Path(path)
    h = hashlib.sha256(str(path.resolve()).encode())
    for p in sorted(path.glob("*")):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    if extra:
        h.update(extra.encode())
    return h.hexdigest()[:16]
