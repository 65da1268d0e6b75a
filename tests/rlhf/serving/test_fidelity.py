"""Fidelity on the default model: llama.cpp on the shipped GGUF (and a version's converted LoRA) predicts what the
torch policy predicts. Teacher-forced on torch's own greedy replies to 12 held-out prompts (`bench fidelity` adds
the trained version's reward-model win rate; BENCHMARKS.md has its figures)."""
from __future__ import annotations

import pytest

from rlhf.serving.llama_cpp.spec import llama_cpp_installed

pytestmark = pytest.mark.skipif(not llama_cpp_installed(),
                                reason="llama-cpp-python is not installed (`make setup` builds it)")


def test_llama_cpp_agrees_with_torch_on_the_base_and_on_a_version(smol_dir, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model

    from bench.fidelity import agreement, held_out_chats
    from rlhf.prompting import encode_prompt
    from rlhf.training.generation import generate_replies
    from rlhf.base_models import load_causal_lm, load_tokenizer, shipped_gguf
    from rlhf.serving.llama_cpp.convert import BaseInfo, lora_to_gguf

    tokenizer = load_tokenizer(str(smol_dir))
    torch.manual_seed(0)
    model = get_peft_model(load_causal_lm(str(smol_dir), "cpu"), LoraConfig(
        r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False),
        adapter_name="v")
    with torch.no_grad():  # a version that moves the policy about as much as a retrain does, not a wrecked one
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.3)
    model.eval()
    model.save_pretrained(tmp_path / "version")
    chats = held_out_chats("You are a helpful assistant.", 12)
    prompts = [encode_prompt(tokenizer, c) for c in chats]
    version, base = generate_replies(model, tokenizer, chats, ["v", None], 32, 0.0, 0)
    gguf = str(shipped_gguf("smollm2-135m-instruct"))
    lora = str(lora_to_gguf(tmp_path / "version" / "v", BaseInfo.read(gguf), tmp_path / "v.gguf"))
    model.set_adapter("v")
    fid_v = agreement(model, gguf, lora, prompts, version.token_ids)
    unserved = agreement(model, gguf, None, prompts, version.token_ids)  # the version vs llama.cpp's bare base
    with model.disable_adapter():
        fid_b = agreement(model, gguf, None, prompts, base.token_ids)
    assert fid_b["tokens"] > 150 and fid_v["tokens"] > 150
    assert fid_b["top1_agreement"] >= 0.95 and fid_v["top1_agreement"] >= 0.95
    assert fid_b["mean_kl"] < 0.05 and fid_v["mean_kl"] < 0.05
    assert unserved["mean_kl"] > 5 * fid_v["mean_kl"]  # the version's effect is far above the engines' difference
