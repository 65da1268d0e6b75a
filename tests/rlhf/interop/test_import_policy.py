"""import-policy: adapters are checked and published; full models become a LoRA by truncated SVD; others refused."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.config import load_config
from rlhf.interop.import_policy import PolicyImportError, import_policy, low_rank_factors
from storage import Store
from tests.conftest import make_tiny_model


@pytest.fixture
def setup(tmp_path, tiny_model_dir):
    config = load_config(env={}, overrides=[f"data_dir={tmp_path / 'data'}", f"base_model={tiny_model_dir}",
                                            "device=cpu"])
    store = Store(config.db_path)
    store.ensure_default_agent(str(tiny_model_dir))
    yield store, config
    store.close()


def test_low_rank_factors_by_hand():
    import torch

    # diag(3, 2, 1): the rank-1 approximation keeps 3 and leaves sqrt(2^2 + 1^2) = sqrt(5) behind.
    delta = torch.diag(torch.tensor([3.0, 2.0, 1.0]))
    B, A, residual = low_rank_factors(delta, 1)
    assert residual == pytest.approx(5 ** 0.5)
    torch.testing.assert_close(B @ A, torch.diag(torch.tensor([3.0, 0.0, 0.0])))
    B, A, residual = low_rank_factors(delta, 5)  # rank above the size: exact, zero-padded to rank 5
    assert B.shape == (3, 5) and A.shape == (5, 3) and residual == pytest.approx(0.0, abs=1e-6)
    torch.testing.assert_close(B @ A, delta)


def test_adapter_is_checked_and_published_as_candidate(setup, tmp_path, tiny_model_dir):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    store, config = setup
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.save_pretrained(tmp_path / "adapter")
    result = import_policy(store, config, tmp_path / "adapter", "assistant")
    assert result.kind == "adapter" and result.policy.status == "candidate" and result.policy.version == 1
    assert result.policy.parent_id == store.active_policy("assistant").id
    assert (tmp_path / "data" / "policies" / "assistant").is_dir()
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == 4


def test_adapter_for_another_shape_is_refused(setup, tmp_path, tokenizer):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    store, config = setup
    other = make_tiny_model(tmp_path / "other", tokenizer, hidden=32)
    get_peft_model(AutoModelForCausalLM.from_pretrained(other), LoraConfig(r=2, target_modules=["q_proj"])) \
        .save_pretrained(tmp_path / "bad-adapter")
    with pytest.raises(PolicyImportError, match="does not fit"):
        import_policy(store, config, tmp_path / "bad-adapter", "assistant")
    assert len(store.list_policies("assistant")) == 1


def perturbed_copy(tiny_model_dir, target, rank_of_change: int, seed: int = 1):
    """The tiny base with a low-rank change added to every q_proj and v_proj (a stand-in for a fine-tune)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith(("q_proj", "v_proj")):
                out_f, in_f = module.weight.shape
                u = torch.randn(out_f, rank_of_change, generator=gen) * 0.1
                v = torch.randn(rank_of_change, in_f, generator=gen) * 0.1
                module.weight += u @ v
    model.save_pretrained(target)
    return target


def test_full_model_becomes_an_exact_lora_when_the_rank_suffices(setup, tmp_path, tiny_model_dir):
    store, config = setup
    full = perturbed_copy(tiny_model_dir, tmp_path / "full", rank_of_change=2)
    result = import_policy(store, config, full, "assistant", rank=4)
    assert result.kind == "full" and result.rank == 4 and result.policy.status == "candidate"
    assert result.metrics["import/reconstruction_error"] < 1e-4
    assert result.metrics["import/untracked_change"] == pytest.approx(0.0, abs=1e-7)
    assert result.metrics["import/probe_logit_max_abs_diff"] < 1e-3
    assert store.get_policy(result.policy.id).metrics["import/rank"] == 4
    from rlhf.serving.policy_server import AdapterRef, GenParams, PolicyServer

    server = PolicyServer.load(str(tiny_model_dir), "cpu", "tiny", max_context_tokens=256)
    try:  # the serving path loads the published adapter and answers with it
        reply = server.generate("", [{"role": "user", "content": "hi"}],
                                AdapterRef(result.policy.id, result.policy.adapter_path),
                                GenParams(max_new_tokens=4, temperature=0))
        assert isinstance(reply, str) and server.loaded_adapters == [f"p{result.policy.id}"]
    finally:
        server.close()


def test_full_model_with_a_too_small_rank_reports_the_error(setup, tmp_path, tiny_model_dir):
    store, config = setup
    full = perturbed_copy(tiny_model_dir, tmp_path / "full", rank_of_change=8)
    result = import_policy(store, config, full, "assistant", rank=1)
    assert 0.2 < result.metrics["import/reconstruction_error"] < 1.0


def test_other_architecture_is_refused_with_advice(setup, tmp_path, tokenizer):
    store, config = setup
    other = make_tiny_model(tmp_path / "deeper", tokenizer, layers=3)
    with pytest.raises(PolicyImportError, match="Create an agent with that model"):
        import_policy(store, config, other, "assistant")
    with pytest.raises(PolicyImportError, match="neither"):
        (tmp_path / "empty").mkdir()
        import_policy(store, config, tmp_path / "empty", "assistant")


def test_cli_import_policy(setup, tmp_path, tiny_model_dir, capsys):
    from cli import main

    store, config = setup
    full = perturbed_copy(tiny_model_dir, tmp_path / "full", rank_of_change=1)
    rc = main(["import-policy", str(full), "--agent", "assistant", "--rank", "2", "--set", f"data_dir={config.data_dir}"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and out["kind"] == "full" and out["status"] == "candidate" and out["version"] == 1
    assert main(["import-policy", str(tmp_path / "nope"), "--agent", "assistant", "--set",
                 f"data_dir={config.data_dir}"]) == 1


# ---- what the cluster engines write (issue 18) ----------------------------------------------------------------
APP_LORA = dict(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])  # ppo.lora_r/alpha


def trained_lora(tiny_model_dir, seed: int = 3):
    """A LoRA with the app's shape and non-zero weights on the tiny base, standing in for a cluster run."""
    import torch
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    # OpenRLHF's Actor: LoraConfig(task_type=TaskType.CAUSAL_LM, r=..., lora_alpha=..., target_modules=...,
    # lora_dropout=..., bias="none") on the loaded causal LM (openrlhf/models/actor.py).
    cfg = LoraConfig(task_type=TaskType.CAUSAL_LM, lora_dropout=0.0, bias="none", init_lora_weights=False, **APP_LORA)
    return get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), cfg).eval()


def logits(model, ids):
    import torch

    with torch.no_grad():
        return model(input_ids=ids).logits


def assert_serves_like(policy, model, tiny_model_dir):
    """The published version, loaded on a fresh base, computes what the trained model computes."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[1, 5, 9, 42, 7, 3]])
    published = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), policy.adapter_path)
    torch.testing.assert_close(logits(published.eval(), ids), logits(model, ids), rtol=1e-4, atol=1e-4)
    files = {p.name for p in Path(policy.adapter_path).iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    assert not files & {"config.json", "adapter_model.bin", "model.safetensors"}  # an adapter, not a full model
    assert "tokenizer.json" in files  # with the tokenizer and chat template it was trained with (issue 43)


@pytest.mark.parametrize("zero3", [False, True], ids=["zero2", "zero3-bin"])
def test_openrlhf_lora_save_imports_as_an_adapter(setup, tmp_path, tiny_model_dir, tokenizer, zero3):
    import torch
    from peft import get_peft_model_state_dict

    store, config = setup
    model = trained_lora(tiny_model_dir)
    out = tmp_path / "rlhf-studio-ppo"
    # DeepspeedStrategy.save_model (openrlhf/utils/deepspeed/deepspeed.py, 0.11.2), for a PeftModel:
    #   model_to_save.save_pretrained(output_dir)
    #   if ds_tensor_parallel_size > 1 or stage == 3:
    #       torch.save(get_peft_model_state_dict(model_to_save, output_state_dict), output_dir/"adapter_model.bin")
    #       os.remove(output_dir/"adapter_model.safetensors")
    #   model_to_save.config.to_json_file(output_dir/"config.json"); tokenizer.save_pretrained(output_dir)
    model.save_pretrained(out)
    if zero3:
        torch.save(get_peft_model_state_dict(model, model.state_dict()), out / "adapter_model.bin")
        (out / "adapter_model.safetensors").unlink()
    model.config.to_json_file(out / "config.json")
    tokenizer.save_pretrained(out)
    result = import_policy(store, config, out, "assistant")
    assert result.kind == "adapter" and result.policy.status == "candidate" and result.rank == config.ppo.lora_r
    assert store.get_policy(result.policy.id).metrics["import/lora_alpha"] == config.ppo.lora_alpha
    assert_serves_like(result.policy, model, tiny_model_dir)


def verl_merged_dir(model, target, tokenizer, lora_alpha=32):
    """What verl's model merger writes for a LoRA actor (verl/model_merger/base_model_merger.py, 0.9.1)."""
    import torch
    from peft import LoraConfig
    from safetensors.torch import save_file

    state = {k: v.detach().clone() for k, v in model.state_dict().items()}  # the FSDP names: PEFT-wrapped
    # save_lora_adapter: lora_ params renamed ".default.weight" -> ".weight", target modules from the names,
    # rank/alpha from lora_train_meta.json, written to target_dir/lora_adapter/.
    lora, targets = {}, set()
    for name in [n for n in state if "lora_" in n]:
        key = name.replace(".default.weight", ".weight")
        targets.add(key.split(".")[-3])
        lora[key] = state.pop(name)
    cfg = LoraConfig(r=16, lora_alpha=lora_alpha, target_modules=list(targets), task_type="CAUSAL_LM").to_dict()
    cfg["task_type"], cfg["peft_type"] = "CAUSAL_LM", "LORA"
    cfg["target_modules"] = list(cfg["target_modules"])
    (target / "lora_adapter").mkdir(parents=True)
    (target / "lora_adapter" / "adapter_config.json").write_text(json.dumps(cfg, indent=4))
    save_file(lora, target / "lora_adapter" / "adapter_model.safetensors")
    # ... then the remaining (base) weights under HF names, saved as the model in bf16, plus the tokenizer.
    base_state = {k.replace("base_model.model.", "").replace(".base_layer.weight", ".weight"): v.to(torch.bfloat16)
                  for k, v in state.items()}
    base_state.pop("lm_head.weight", None)  # drop_tied_target_keys: tied to the embeddings
    model.get_base_model().save_pretrained(target, state_dict=base_state)
    tokenizer.save_pretrained(target)
    return target


def test_verl_merged_lora_imports_its_lora_adapter(setup, tmp_path, tiny_model_dir, tokenizer):
    store, config = setup
    model = trained_lora(tiny_model_dir, seed=4)
    merged = verl_merged_dir(model, tmp_path / "rlhf-studio-verl-hf", tokenizer)
    assert (merged / "config.json").is_file() and (merged / "lora_adapter" / "adapter_config.json").is_file()
    result = import_policy(store, config, merged, "assistant")
    assert result.kind == "adapter" and result.rank == 16 and result.policy.status == "candidate"
    assert store.get_policy(result.policy.id).config["targets"] == sorted(APP_LORA["target_modules"])
    assert_serves_like(result.policy, model, tiny_model_dir)


def test_verl_merged_lora_without_alpha_is_refused(setup, tmp_path, tiny_model_dir, tokenizer):
    store, config = setup
    merged = verl_merged_dir(trained_lora(tiny_model_dir), tmp_path / "hf", tokenizer, lora_alpha=0)
    with pytest.raises(PolicyImportError, match="lora_alpha"):
        import_policy(store, config, merged, "assistant")
    assert len(store.list_policies("assistant")) == 1


def test_verl_merged_full_model_in_bf16_becomes_the_apps_lora(setup, tmp_path, tiny_model_dir, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    store, config = setup
    full = perturbed_copy(tiny_model_dir, tmp_path / "fp32", rank_of_change=2)
    # The merger saves the full model in bf16 (from_config(torch_dtype=torch.bfloat16); save_pretrained) with
    # the tokenizer: a plain Hugging Face directory, compared here against the fp32 base.
    merged = tmp_path / "rlhf-studio-verl-hf"
    AutoModelForCausalLM.from_pretrained(full, dtype=torch.bfloat16).save_pretrained(merged)
    tokenizer.save_pretrained(merged)
    result = import_policy(store, config, merged, "assistant", rank=16,
                           targets=tuple(APP_LORA["target_modules"]))
    assert result.kind == "full" and result.rank == 16 and result.policy.status == "candidate"
    # bf16 rounding touches every weight; the rank-2 change still dominates what the adapter keeps.
    assert result.metrics["import/reconstruction_error"] < 0.2
    assert result.metrics["import/probe_logit_max_abs_diff"] < 0.05
    adapter_cfg = json.loads((Path(result.policy.adapter_path) / "adapter_config.json").read_text())
    assert adapter_cfg["r"] == 16 and sorted(adapter_cfg["target_modules"]) == sorted(APP_LORA["target_modules"])


def test_full_model_with_all_linear_targets(setup, tmp_path, tiny_model_dir):
    """`--targets all-linear` (the recipes' spelling when the app's LoRA covers every linear layer)."""
    store, config = setup
    full = perturbed_copy(tiny_model_dir, tmp_path / "full", rank_of_change=2)
    result = import_policy(store, config, full, "assistant", rank=4, targets=("all-linear",))
    adapter_cfg = json.loads((Path(result.policy.adapter_path) / "adapter_config.json").read_text())
    assert sorted(adapter_cfg["target_modules"]) == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj",
                                                     "up_proj", "v_proj"]  # every nn.Linear but lm_head
    assert result.metrics["import/reconstruction_error"] < 1e-4
