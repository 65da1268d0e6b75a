"""import-policy: adapters are checked and published; full models become a LoRA by truncated SVD; others refused."""
from __future__ import annotations

import json

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
    from rlhf.serving.server import AdapterRef, GenParams, PolicyServer

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
    from rlhf.cli import main

    store, config = setup
    full = perturbed_copy(tiny_model_dir, tmp_path / "full", rank_of_change=1)
    rc = main(["import-policy", str(full), "--agent", "assistant", "--rank", "2", "--set", f"data_dir={config.data_dir}"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and out["kind"] == "full" and out["status"] == "candidate" and out["version"] == 1
    assert main(["import-policy", str(tmp_path / "nope"), "--agent", "assistant", "--set",
                 f"data_dir={config.data_dir}"]) == 1
