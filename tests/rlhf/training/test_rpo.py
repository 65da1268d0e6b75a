"""RPO (``retrain.method: rpo``): DPO plus the chosen replies' likelihood, on a tiny real model; the method added
through the registry alone (its own module and config section)."""
from __future__ import annotations

import math

import pytest

from rlhf.config import load_config
from tests.rlhf.training.test_dpo import PAIRS, one_thread  # noqa: F401 (an autouse fixture)

pytestmark = pytest.mark.slow  # trains


def rpo_config(tmp_path, model_dir, *overrides):
    return load_config(env={}, overrides=[
        f"data_dir={tmp_path / 'data'}", f"base_model={model_dir}", "device=cpu", "retrain.method=rpo",
        "rpo.batch_size=4", "rpo.epochs=4", "rpo.learning_rate=0.01", *overrides])


def chosen_logprob(model_dir, adapter) -> float:
    """Mean log π(chosen | prompt) over PAIRS under the base (adapter None) or an adapter."""
    from rlhf.prompting import encode_prompt
    from rlhf.retrain.assess import adapters_on_base
    from rlhf.retrain.evaluation import sequence_logprobs

    model, tok = adapters_on_base(str(model_dir), "cpu", {"new": adapter})
    ids = [encode_prompt(tok, p["prompt"]) for p in PAIRS]
    replies = [tok(p["chosen"] + tok.eos_token, add_special_tokens=False)["input_ids"] for p in PAIRS]
    return sum(sequence_logprobs(model, ids, replies, "new" if adapter else None)) / len(PAIRS)


def test_rpo_raises_the_chosen_replies_likelihood_beyond_plain_dpo(tmp_path, tiny_model_dir):
    from rlhf.training.policy import train_policy

    runs = {}
    for weight in (0.0, 1.0):
        config = rpo_config(tmp_path, tiny_model_dir, f"rpo.nll_weight={weight}")
        result = train_policy(config, str(tiny_model_dir), None, PAIRS, [], [], tmp_path / f"run{weight}",
                              device="cpu")
        assert (result.final_dir / "adapter_model.safetensors").is_file() and result.steps == 4
        assert all(math.isfinite(m["loss/policy"]) for m in result.history)
        runs[weight] = chosen_logprob(tiny_model_dir, str(result.final_dir))
    base = chosen_logprob(tiny_model_dir, None)
    assert runs[1.0] > base and runs[1.0] > runs[0.0] + 0.5  # the likelihood term pulls the chosen replies up
