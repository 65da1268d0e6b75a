"""The Hugging Face tokenizer of a GGUF file, splitting text as the model's own tokenizer does.

transformers rebuilds a tokenizer from a GGUF's vocabulary and merges, and sets its pre-tokenizer from the GGUF's
``tokenizer.ggml.pre`` for the names it knows ("llama-bpe", "qwen2", ...). For the others, among them SmolLM's
"smollm", it leaves GPT-2's plain ``ByteLevel`` split, which keeps a space with the digits after it: " ٣٤٥"
becomes "ĠÙ" + ... where SmolLM2's own tokenizer (and llama.cpp) split every digit off first and give "Ġ" + ....
``restore_pre_tokenizer`` puts the model's split back; ``repair_saved`` fixes a tokenizer saved before it did.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)

# llama.cpp names whose split is "every digit alone, then GPT-2's regex" (llama-vocab.cpp's STARCODER group).
DIGITS_THEN_GPT2 = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva",
                              "mellum2"})


def _digits_then_gpt2():
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])


def gguf_pre(gguf_file: str | Path) -> Optional[str]:
    """The ``tokenizer.ggml.pre`` a GGUF file names (None when it names none)."""
    from rlhf.gguf_header import read_fields

    return read_fields(gguf_file, ["tokenizer.ggml.pre"]).get("tokenizer.ggml.pre")


def restore_pre_tokenizer(tokenizer, pre: Optional[str]):
    """Give a tokenizer built from a GGUF the split its ``tokenizer.ggml.pre`` names, where transformers left
    GPT-2's; returns the tokenizer."""
    if pre in DIGITS_THEN_GPT2:
        tokenizer.backend_tokenizer.pre_tokenizer = _digits_then_gpt2()
    return tokenizer


def tokenizer_from_gguf(gguf_file: str | Path):
    """The Hugging Face tokenizer of a GGUF file, with the model's own pre-tokenizer."""
    from transformers import AutoTokenizer

    gguf_file = Path(gguf_file)
    tok = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    return restore_pre_tokenizer(tok, gguf_pre(gguf_file))


def repair_saved(tokenizer_dir: str | Path, gguf_file: Optional[str | Path]) -> None:
    """Give a tokenizer saved from ``gguf_file`` by an older version of the app the model's own split (in place,
    one rename); nothing when it has it already or the GGUF names no split to restore."""
    from tokenizers import Tokenizer

    path = Path(tokenizer_dir) / "tokenizer.json"
    if gguf_file is None or not path.is_file() or not Path(gguf_file).is_file() \
            or gguf_pre(gguf_file) not in DIGITS_THEN_GPT2:
        return
    saved = Tokenizer.from_file(str(path))
    before = json.loads(saved.to_str()).get("pre_tokenizer")
    saved.pre_tokenizer = _digits_then_gpt2()
    if json.loads(saved.to_str()).get("pre_tokenizer") == before:
        return
    tmp = path.with_name(".tokenizer.json.tmp")
    saved.save(str(tmp))
    tmp.replace(path)
    log.info("restored the model's own pre-tokenizer in %s (digits split one by one, as the model was trained)", path)
