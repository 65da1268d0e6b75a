"""DPO beside PPO on a tiny real model: TRL's DPOTrainer moves the policy toward the chosen replies."""
from __future__ import annotations

import math

import pytest
import torch

from rlhf.config import load_config

pytestmark = pytest.mark.slow  # trains


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def dpo_config(tmp_path, model_dir, *overrides):
    return load_config(env={}, overrides=[
        f"data_dir={tmp_path / 'data'}", f"base_model={model_dir}", "device=cpu", "retrain.method=dpo",
        "dpo.batch_size=4", "dpo.epochs=4", "dpo.learning_rate=0.01", *overrides])


PAIRS = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Tell me about {w}."}],
          "chosen": "Yes yes yes.", "rejected": f"No, {w} is not."} for w in ("cats", "dogs", "rain", "tea")]


def margin(model_dir, adapter, tokenizer) -> float:
    """Mean log π(chosen) − log π(rejected) over PAIRS under the base (adapter None) or an adapter."""
    from rlhf.retrain.evaluation import sequence_logprobs
    from rlhf.retrain.assess import adapters_on_base
    from rlhf.prompting import encode_prompt

    model, tok = adapters_on_base(str(model_dir), "cpu", {"new": adapter})
    ids = [encode_prompt(tok, p["prompt"]) for p in PAIRS]
    reply = lambda key: [tok(p[key] + tok.eos_token, add_special_tokens=False)["input_ids"] for p in PAIRS]  # noqa
    name = "new" if adapter else None
    chosen, rejected = (sequence_logprobs(model, ids, reply(k), name) for k in ("chosen", "rejected"))
    return sum(c - r for c, r in zip(chosen, rejected)) / len(PAIRS)


def test_dpo_rows_use_the_one_prompt_encoder(tokenizer):
    from rlhf.prompting import encode_prompt
    from rlhf.training.dpo import dpo_rows

    rows = dpo_rows(tokenizer, PAIRS[:1], 384)
    assert rows[0]["chosen"] == "Yes yes yes." and rows[0]["rejected"] == "No, cats is not."
    assert tokenizer(rows[0]["prompt"], add_special_tokens=False)["input_ids"] == \
        encode_prompt(tokenizer, PAIRS[0]["prompt"], 384)


def test_dpo_moves_the_policy_toward_the_chosen_replies(tmp_path, tiny_model_dir, tokenizer):
    from rlhf.training.policy import train_policy

    config = dpo_config(tmp_path, tiny_model_dir)
    result = train_policy(config, str(tiny_model_dir), None, PAIRS, [], [], tmp_path / "run", device="cpu")
    assert (result.final_dir / "adapter_model.safetensors").is_file()
    assert not (result.final_dir / "ref").exists()  # only the new version's adapter is published
    assert result.steps == 4 and len(result.history) == 4 and math.isnan(result.kl)
    assert all(math.isfinite(m["loss/policy"]) for m in result.history)
    assert result.history[-1]["loss/policy"] < result.history[0]["loss/policy"]
    before, after = margin(tiny_model_dir, None, tokenizer), margin(tiny_model_dir, str(result.final_dir), tokenizer)
    assert after > before + 1.0  # the chosen replies gained log-probability over the rejected ones
    assert set(result.phase_seconds) == {"prepare", "update"}


def test_dpo_continues_a_version_and_publishes_only_its_adapter(tmp_path, tiny_model_dir):
    from tests.conftest import make_adapter
    from rlhf.training.dpo import train_dpo

    start = make_adapter(tiny_model_dir, tmp_path / "start", seed=3)
    config = dpo_config(tmp_path, tiny_model_dir, "dpo.epochs=1")
    result = train_dpo(config, str(tiny_model_dir), PAIRS, tmp_path / "run", init_adapter=start, device="cpu")
    assert (result.final_dir / "adapter_model.safetensors").is_file() and not (result.final_dir / "ref").exists()
    assert list(result.policy.policy.peft_config) == ["default"]
