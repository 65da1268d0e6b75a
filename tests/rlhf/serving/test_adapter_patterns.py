"""Issue #33: an adapter's rank/alpha patterns are regular expressions from outside (an import, a restored
archive). One that does not compile, or that backtracks for minutes, is an AdapterError before anything loads it; at
start such a version is marked broken with the reason, and the others are served."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.serving.adapter_patterns import check_adapter, module_keys, module_matches, scaling
from rlhf.retrain.publish import check_adapters
from rlhf.serving.interface import AdapterError
from tests.conftest import make_adapter

SLOW = r"(\w|\w\w|\.)+X"  # fine for the regex package, seconds to minutes for Python's re on a module name


@pytest.fixture(scope="module")
def adapter(tiny_model_dir, tmp_path_factory) -> Path:
    return Path(make_adapter(tiny_model_dir, tmp_path_factory.mktemp("patterns") / "a", seed=1))


def with_patterns(adapter: Path, target: Path, **patterns) -> Path:
    import shutil

    shutil.copytree(adapter, target)
    cfg = json.loads((target / "adapter_config.json").read_text())
    cfg.update(patterns)
    (target / "adapter_config.json").write_text(json.dumps(cfg))
    return target


@pytest.mark.slow  # waits out the real 5 s check on a catastrophic pattern: the full suite only
def test_patterns_are_checked_against_the_adapters_own_modules(adapter, tmp_path):
    keys = module_keys(adapter)
    assert keys and all(k.endswith(("q_proj", "v_proj")) for k in keys)
    check_adapter(with_patterns(adapter, tmp_path / "fine", alpha_pattern={"q_proj": 16}, rank_pattern={}))
    for bad, message in (({"alpha_pattern": {"([": 16}}, "not a valid regular expression"),
                         ({"alpha_pattern": {SLOW: 16}}, "take over"),
                         ({"rank_pattern": {"q" * 300: 4}}, "1-256 characters"),
                         ({"alpha_pattern": {"q_proj": "big"}}, "positive number"),
                         ({"alpha_pattern": ["q_proj"]}, "must map patterns")):
        with pytest.raises(AdapterError, match=message):
            check_adapter(with_patterns(adapter, tmp_path / f"bad{len(list(tmp_path.iterdir()))}", **bad))


@pytest.mark.slow  # waits out the real 5 s check on a catastrophic pattern: the full suite only
def test_a_version_with_a_bad_pattern_is_marked_broken_at_start(store, adapter, tmp_path):
    good = store.register_policy_version("assistant", str(with_patterns(adapter, tmp_path / "good")), 1, False)
    slow = store.register_policy_version("assistant", str(with_patterns(adapter, tmp_path / "slow",
                                                                        alpha_pattern={SLOW: 4})), 1, False)
    broken = store.register_policy_version("assistant", str(with_patterns(adapter, tmp_path / "broken",
                                                                          rank_pattern={"(q": 4})), 1, False)
    assert sorted(p.id for p in check_adapters(store)) == [slow.id, broken.id]
    assert "take over" in store.get_policy(slow.id).error and "regular expression" in store.get_policy(broken.id).error
    assert store.get_policy(good.id).status == "candidate"


def test_the_bounded_match_and_scaling():
    assert module_matches("q_proj", "model.layers.0.self_attn.q_proj")
    assert not module_matches("proj", "model.layers.0.self_attn.q_proj")  # whole names only, as PEFT reads them
    cfg = {"lora_alpha": 32, "alpha_pattern": {r"layers\.0\.self_attn\.q_proj": 8}}
    assert scaling(cfg, "model.layers.0.self_attn.q_proj", 16) == 0.5
    assert scaling(cfg, "model.layers.1.self_attn.q_proj", 16) == 2.0
    with pytest.raises(AdapterError, match="regular expression"):
        module_matches("([", "x")
