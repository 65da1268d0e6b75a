"""The llama.cpp engine's own promises: GGUF conversions that compute what torch computes (the base, and a PEFT
LoRA including llama.cpp's q/k row permutation), adapters it cannot serve refused with the reason, many versions
on one base, and ``auto`` picking it on CPU."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rlhf.serving.interface import AdapterError
from rlhf.serving.llama_cpp.spec import llama_cpp_installed
from rlhf.serving.policy_server import AdapterRef, GenParams, PolicyServer

pytestmark = [pytest.mark.skipif(not llama_cpp_installed(),
                                reason="llama-cpp-python is not installed (`make setup` builds it)"),
              pytest.mark.slow]  # loads llama.cpp (another engine): the full suite only
HISTORY = [{"role": "user", "content": "Say something."}]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def llama_logits(gguf, ids: list[int], lora_path=None) -> np.ndarray:
    """Teacher-forced logits of every position from llama.cpp (low-level API, one sequence)."""
    from rlhf.serving.llama_cpp.lib import Batch, Context, Lora, Model

    model = Model(gguf)
    ctx, batch = Context(model, 512, 1, 256, 1), Batch(model.lib, 256)
    lora = Lora(model, lora_path) if lora_path else None
    ctx.set_lora(lora)
    for i, t in enumerate(ids):
        batch.add(t, i, 0, True)
    assert ctx.decode(batch) == 0
    out = np.stack([ctx.logits(i).copy() for i in range(len(ids))])
    for obj in (batch, ctx, lora, model):
        if obj is not None:
            obj.close()
    return out


def torch_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float().numpy()


@pytest.fixture(scope="module")
def f32_gguf(tiny_model_dir, tmp_path_factory):
    """The tiny model converted with full-precision weights, so llama.cpp and torch should agree to rounding."""
    from rlhf.serving.llama_cpp.convert import hf_to_gguf

    return hf_to_gguf(tiny_model_dir, tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf", weight_type="f32")


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    return tokenizer.apply_chat_template([{"role": "user", "content": "Write a haiku about the sea."}],
                                         add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]


def test_a_converted_base_computes_what_torch_computes(tiny_model_dir, f32_gguf, prompt_ids):
    from rlhf.base_models import load_causal_lm

    ours, theirs = llama_logits(f32_gguf, prompt_ids), torch_logits(load_causal_lm(str(tiny_model_dir), "cpu"),
                                                                    prompt_ids)
    np.testing.assert_allclose(ours, theirs, atol=2e-3, rtol=0)


@pytest.mark.slow  # converts a model or builds adapters: the full suite only
@pytest.mark.parametrize("targets,rslora", [(["q_proj", "k_proj"], False),
                                            (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj"], True)])
def test_a_converted_lora_computes_what_peft_computes(tiny_model_dir, f32_gguf, prompt_ids, tmp_path, targets, rslora):
    """q/k alone fail without llama.cpp's row permutation; rsLoRA and a per-module alpha check the folded scaling."""
    import torch
    from peft import LoraConfig, get_peft_model

    from rlhf.base_models import load_causal_lm
    from rlhf.serving.llama_cpp.convert import BaseInfo, lora_to_gguf

    torch.manual_seed(3)
    peft_model = get_peft_model(load_causal_lm(str(tiny_model_dir), "cpu"), LoraConfig(
        r=8, lora_alpha=16, target_modules=targets, init_lora_weights=False, use_rslora=rslora,
        alpha_pattern={"o_proj": 4} if rslora else {}))
    peft_model.save_pretrained(tmp_path / "adapter")
    expected = torch_logits(peft_model, prompt_ids)
    with peft_model.disable_adapter():
        base = torch_logits(peft_model, prompt_ids)
    assert np.abs(expected - base).max() > 0.05  # the adapter really changes the model
    out = lora_to_gguf(tmp_path / "adapter", BaseInfo.read(f32_gguf), tmp_path / "a.gguf", dtype="f32")
    np.testing.assert_allclose(llama_logits(f32_gguf, prompt_ids, out), expected, atol=5e-3, rtol=0)


@pytest.mark.parametrize("change,reason", [({"use_dora": True}, "DoRA"),
                                           ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
                                           ({"bias": "all"}, "bias")])
@pytest.mark.slow  # converts a model or builds adapters: the full suite only
def test_an_adapter_llama_cpp_cannot_serve_is_refused_with_the_reason(tiny_model_dir, f32_gguf, tmp_path,
                                                                      change, reason):
    from rlhf.serving.llama_cpp.convert import BaseInfo, lora_to_gguf
    from tests.conftest import make_adapter

    path = make_adapter(tiny_model_dir, tmp_path / "a", seed=1)
    config_file = tmp_path / "a" / "adapter_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **change}))
    with pytest.raises(AdapterError, match=reason):
        lora_to_gguf(path, BaseInfo.read(f32_gguf), tmp_path / "a.gguf")


@pytest.mark.slow  # converts a model or builds adapters: the full suite only
def test_an_adapter_for_another_base_is_refused(tiny_model_dir, f32_gguf, tmp_path, tokenizer):
    from rlhf.serving.llama_cpp.convert import BaseInfo, lora_to_gguf
    from tests.conftest import make_adapter, make_tiny_model

    other = make_tiny_model(tmp_path / "wide", tokenizer, hidden=128)
    path = make_adapter(other, tmp_path / "a", seed=1)
    with pytest.raises(AdapterError, match="wrong base model"):
        lora_to_gguf(path, BaseInfo.read(f32_gguf), tmp_path / "a.gguf")


@pytest.fixture(scope="module")
def lserver(tiny_model_dir, tmp_path_factory):
    s = PolicyServer.load(str(tiny_model_dir), "cpu", "tiny", max_context_tokens=256, engine="llama_cpp",
                          data_dir=str(tmp_path_factory.mktemp("ldata")), options={"kv_cache_tokens": 1024})
    yield s
    s.close()


@pytest.mark.slow  # seconds of real work: the full suite only (make test-fast < 60 s)
def test_ten_versions_share_one_base_and_one_context(lserver, tiny_model_dir, tmp_path):
    from tests.conftest import make_adapter

    paths = [make_adapter(tiny_model_dir, tmp_path / f"v{i}", seed=40 + i) for i in range(10)]
    replies = {lserver.generate("", HISTORY, AdapterRef(40 + i, p), GenParams(max_new_tokens=8, temperature=0))
               for i, p in enumerate(paths)}
    assert len(replies) >= 5 and len(lserver.loaded_adapters) >= 10
    assert lserver.engine.profile()["contexts"] == 1  # served one after another: one KV cache, rebound


def test_two_versions_at_once_decode_in_two_contexts(lserver, tiny_model_dir, tmp_path):
    from tests.conftest import make_adapter

    a, b = (AdapterRef(60 + i, make_adapter(tiny_model_dir, tmp_path / f"w{i}", seed=60 + i)) for i in range(2))
    params = GenParams(max_new_tokens=30, temperature=0)
    alone = [lserver.generate("", HISTORY, ref, params) for ref in (a, b)]
    streams = [lserver.stream("", HISTORY, ref, params) for ref in (a, b)]
    assert [s.text() for s in streams] == alone and lserver.engine.profile()["contexts"] >= 2


def test_a_reply_that_cannot_fit_the_kv_cache_fails_clearly(lserver):
    stream = lserver.stream("", HISTORY, AdapterRef(0), GenParams(max_new_tokens=2000, temperature=0))
    with pytest.raises(ValueError, match="kv_cache_tokens"):
        stream.text()


def test_auto_tries_llama_cpp_then_its_safe_load_then_transformers_on_cpu_and_transformers_on_cuda(app_config):
    from rlhf.config import apply_overrides
    from rlhf.serving.startup import engine_specs

    specs, _ = engine_specs(app_config, "cpu")
    assert [(s.name, s.settings.get("extra_buffers")) for s in specs] == \
        [("llama_cpp", True), ("llama_cpp", False), ("transformers", None)]
    assert [s.name for s in engine_specs(app_config, "cuda")[0]] == ["transformers"]
    explicit = engine_specs(apply_overrides(app_config, {"serving.engine": "llama_cpp"}), "cpu")[0]
    assert [s.name for s in explicit] == ["llama_cpp", "llama_cpp"]  # nothing else: it stops start-up instead
    assert [s.name for s in engine_specs(apply_overrides(app_config, {"serving.engine": "transformers"}), "cpu")[0]] \
        == ["transformers"]


@pytest.mark.slow  # converts a model or builds adapters: the full suite only
def test_the_app_serves_through_llama_cpp_by_default_on_cpu(app_config):
    from rlhf.serving.policy_server import load_server

    server = load_server(app_config)
    try:
        assert server.engine_name == "llama_cpp"
        assert server.generate("", HISTORY, AdapterRef(0), GenParams(max_new_tokens=4, temperature=0)) is not None
    finally:
        server.close()


@pytest.mark.slow  # converts a model or builds adapters: the full suite only
def test_a_local_gguf_base_serves_and_converts_for_torch(f32_gguf, tmp_path):
    from rlhf.base_models import resolve_model

    server = PolicyServer.load(str(f32_gguf), "cpu", "tiny", engine="llama_cpp", data_dir=str(tmp_path))
    try:
        assert server.generate("", HISTORY, AdapterRef(0), GenParams(max_new_tokens=4, temperature=0)) is not None
    finally:
        server.close()
    model_dir = resolve_model(str(f32_gguf), tmp_path)  # what training loads: the GGUF dequantized once
    assert (tmp_path / "models").is_dir() and model_dir.startswith(str(tmp_path / "models"))


def test_a_version_llama_cpp_cannot_serve_is_marked_broken_with_the_reason(lserver, store, tiny_model_dir, tmp_path):
    from storage import Conflict
    from tests.conftest import make_adapter
    from ui.flows.chat import begin_reply

    path = make_adapter(tiny_model_dir, tmp_path / "dora", seed=5)
    config_file = tmp_path / "dora" / "adapter_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "use_dora": True}))
    agent = store.get_agent(None)
    version = store.register_policy_version(agent.id, path, store.active_policy(agent.id).id, promote=False)
    conv = store.create_conversation(agent.id, "ann", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(Conflict, match="DoRA"):
        begin_reply(store, lserver, store.leaf(conv.id).id, version, GenParams(max_new_tokens=4))
    broken = store.get_policy(version.id)
    assert broken.status == "broken" and "DoRA" in (broken.error or "")


@pytest.mark.slow  # converts a model or builds adapters: the full suite only
def test_weights_can_be_requantized_for_llama_cpp(tiny_model_dir, tmp_path):
    from rlhf.config import ConfigError, load_config

    server = PolicyServer.load(str(tiny_model_dir), "cpu", "tiny", engine="llama_cpp", data_dir=str(tmp_path),
                               options={"weights": "q4_0"})
    try:
        assert [p.name for p in (tmp_path / "gguf").glob("*.gguf") if "q4_0" in p.name]  # converted once, cached
        assert server.generate("", HISTORY, AdapterRef(0), GenParams(max_new_tokens=4, temperature=0)) is not None
    finally:
        server.close()
    with pytest.raises(ConfigError, match="llama_weights"):
        load_config(env={}, overrides=["serving.llama_weights=q2_k"])
