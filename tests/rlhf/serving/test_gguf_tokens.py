"""A converted GGUF splits text into the ids transformers gives: the converter names the model's own pre-tokenizer
(llama.cpp's fingerprint of the tokenizer) and writes every tokenizer field llama.cpp reads. Before, it wrote
"default", and of 1,200 corpus texts llama.cpp tokenized only a part as transformers does."""
from __future__ import annotations

import copy
import json
import shutil

import pytest

from rlhf.serving.interface import EngineUnavailable
from rlhf.serving.llama_cpp.spec import llama_cpp_installed
from tests.support.token_corpus import corpus

LLAMA = [pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed (`make setup`)"),
         pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model_dir, tmp_path_factory):
    from rlhf.serving.llama_cpp.convert import hf_to_gguf

    return hf_to_gguf(tiny_model_dir, tmp_path_factory.mktemp("gguf") / "tiny.gguf", weight_type="f16")


def fields(path) -> dict:
    import gguf

    reader = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in reader.fields.items()
            if k.startswith("tokenizer.") and k not in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")}


@pytest.mark.slow  # converts a model
def test_the_converter_names_the_models_own_pre_tokenizer_and_its_special_tokens(tiny_gguf, tokenizer):
    f = fields(tiny_gguf)
    assert f["tokenizer.ggml.model"] == "gpt2" and f["tokenizer.ggml.pre"] == "smollm"  # was "default"
    assert f["tokenizer.ggml.bos_token_id"] == tokenizer.bos_token_id
    assert f["tokenizer.ggml.eos_token_id"] == tokenizer.eos_token_id
    assert f["tokenizer.ggml.padding_token_id"] == tokenizer.pad_token_id
    assert f["tokenizer.ggml.add_bos_token"] is False and f["tokenizer.ggml.add_eos_token"] is False
    assert f["tokenizer.chat_template"] == tokenizer.chat_template


@pytest.mark.slow  # converts a model
def test_a_tokenizer_whose_split_llama_cpp_does_not_know_is_refused_with_the_reason(tiny_model_dir, tmp_path):
    from rlhf.serving.llama_cpp.convert import hf_to_gguf

    model_dir = tmp_path / "odd"
    shutil.copytree(tiny_model_dir, model_dir)
    spec = json.loads((model_dir / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Whitespace"}
    (model_dir / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(EngineUnavailable, match="pre-tokenizer"):
        hf_to_gguf(model_dir, tmp_path / "odd.gguf", weight_type="f16")
    assert not (tmp_path / "odd.gguf").exists() or (tmp_path / "odd.gguf").stat().st_size == 0


def mismatches(gguf_file, tokenizer, texts) -> list[str]:
    from rlhf.serving.llama_cpp.lib import Model

    model = Model(gguf_file)
    try:
        return [t for t in texts if model.tokenize(t) != tokenizer.encode(t)]
    finally:
        model.close()


@pytest.mark.parametrize("which", [pytest.param(w, marks=LLAMA) for w in ("converted", "shipped")])
def test_llama_cpp_tokenizes_a_corpus_exactly_as_transformers(tiny_gguf, tokenizer, which):
    from rlhf.base_models import shipped_gguf

    gguf_file = tiny_gguf if which == "converted" else shipped_gguf("smollm2-135m-instruct")
    texts = corpus(1200)
    wrong = mismatches(gguf_file, tokenizer, texts)
    assert not wrong, f"{len(texts) - len(wrong)} of {len(texts)} identical; e.g. {wrong[:5]}"


def test_the_tokenizer_built_from_a_gguf_splits_digits_as_the_model_does(tokenizer):
    """transformers leaves GPT-2's split for "smollm", which keeps a space with non-ASCII digits ("ĠÙ")."""
    assert tokenizer.tokenize(" ٣٤٥")[:2] == ["Ġ", "Ù"] and tokenizer.tokenize(" 42") == ["Ġ", "4", "2"]


def test_a_tokenizer_saved_before_the_fix_is_repaired_in_place(tokenizer, tmp_path):
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    from rlhf.base_models import shipped_gguf
    from rlhf.gguf_tokenizer import repair_saved

    old = copy.deepcopy(tokenizer)
    old.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    old.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).tokenize(" ٣")[0] == "ĠÙ"  # the old, wrong split
    repair_saved(tmp_path, shipped_gguf("smollm2-135m-instruct"))
    assert AutoTokenizer.from_pretrained(tmp_path).tokenize(" ٣")[0] == "Ġ"
