"""Other model families than SmolLM2's Llama, end to end on tiny random models built offline (the shipped
tokenizer borrowed, as ``make_tiny_model`` does): load, chat, a LoRA retrain step, the GGUF LoRA a version carries,
and llama.cpp serving where the converter takes the architecture, else a fallback whose reason names it."""
from __future__ import annotations

import pytest

from rlhf.serving.interface import EngineUnavailable
from rlhf.serving.llama_cpp.spec import llama_cpp_installed
from rlhf.serving.policy_server import AdapterRef, GenParams, PolicyServer

FAMILIES = ["llama", "qwen2", "gemma3_text"]
LLAMA_CPP_TAKES = {"llama"}  # architectures rlhf.serving.llama_cpp.convert writes


def make_family_model(target, tokenizer, family: str, seed: int = 0):
    """A random model of ``family`` (2 layers, hidden 64) with the shipped tokenizer, saved to ``target``."""
    import torch
    from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)

    common = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    kinds = {"llama": (LlamaConfig, LlamaForCausalLM, {}),
             "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
             "gemma3_text": (Gemma3TextConfig, Gemma3ForCausalLM, {"head_dim": 16, "sliding_window": 64})}
    config_cls, model_cls, extra = kinds[family]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**common, **extra))
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request, tmp_path_factory, tokenizer):
    return request.param, make_family_model(tmp_path_factory.mktemp(request.param), tokenizer, request.param)


def test_a_family_loads_and_chats(family_dir):
    family, model_dir = family_dir
    server = PolicyServer.load(str(model_dir), "cpu", family, max_context_tokens=256)
    try:
        assert server.model.config.model_type == family
        stream = server.stream("Be brief.", [{"role": "user", "content": "Hi"}], AdapterRef(1),
                               GenParams(max_new_tokens=6, temperature=0))
        stream.text()
        assert stream.n_tokens > 0
    finally:
        server.close()


@pytest.mark.slow  # converts a model
def test_llama_cpp_takes_the_family_or_says_why(family_dir, tmp_path):
    from rlhf.serving.llama_cpp.base import llama_base

    family, model_dir = family_dir
    if family in LLAMA_CPP_TAKES:
        gguf_file, tokenizer_source = llama_base(str(model_dir), tmp_path, "f16")
        assert gguf_file.is_file() and tokenizer_source == str(model_dir)
    else:
        with pytest.raises(EngineUnavailable, match=f"model_type '{family}'"):
            llama_base(str(model_dir), tmp_path, "f16")


@pytest.mark.slow  # trains (one DPO step)
def test_a_family_retrains_a_lora_and_carries_its_gguf_lora_or_the_reason(family_dir, tmp_path):
    from rlhf.config import load_config
    from rlhf.retrain.bundle import GGUF_LORA, add_gguf_lora
    from rlhf.training.dpo import train_dpo

    family, model_dir = family_dir
    config = load_config(env={}, overrides=[f"data_dir={tmp_path / 'data'}", f"base_model={model_dir}", "device=cpu",
                                            "retrain.method=dpo", "dpo.batch_size=4", "dpo.epochs=1"])
    pairs = [{"prompt": [{"role": "user", "content": f"Tell me about {w}."}], "chosen": "Yes.",
              "rejected": f"No, {w}."} for w in ("cats", "dogs", "rain", "tea")]
    result = train_dpo(config, str(model_dir), pairs, tmp_path / "run", device="cpu")
    assert (result.final_dir / "adapter_model.safetensors").is_file() and result.steps == 1
    why_not = add_gguf_lora(result.final_dir, str(model_dir))
    if family in LLAMA_CPP_TAKES:
        assert why_not is None and (result.final_dir / GGUF_LORA).is_file()
    else:
        assert f"model_type '{family}'" in why_not and not (result.final_dir / GGUF_LORA).exists()


@pytest.mark.slow  # loads llama.cpp
@pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed (`make setup`)")
def test_llama_cpp_serves_the_family_it_takes_with_the_same_tokens_and_logits(family_dir, tmp_path, tokenizer):
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from rlhf.prompting import encode_prompt
    from rlhf.serving.llama_cpp.base import llama_base
    from rlhf.serving.llama_cpp.lib import Batch, Context, Model
    from tests.support.token_corpus import corpus

    family, model_dir = family_dir
    if family not in LLAMA_CPP_TAKES:
        pytest.skip(f"llama.cpp conversion here does not take {family} (the fallback is tested above)")
    gguf_file, _ = llama_base(str(model_dir), tmp_path, "f16")
    model = Model(gguf_file)
    ctx, batch = Context(model, 256, 1, 256, 1), Batch(model.lib, 256)
    try:
        assert all(model.tokenize(t) == tokenizer.encode(t) for t in corpus(300))
        ids = encode_prompt(tokenizer, [{"role": "user", "content": "Hello there"}])
        for i, t in enumerate(ids):
            batch.add(t, i, 0, i == len(ids) - 1)
        assert ctx.decode(batch) == 0
        ours = ctx.logits(-1).copy()
    finally:
        batch.close(), ctx.close(), model.close()
    with torch.inference_mode():
        theirs = AutoModelForCausalLM.from_pretrained(model_dir)(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(ours, theirs, atol=2e-2, rtol=0)  # f16 weights
