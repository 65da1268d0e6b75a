"""``serving.engine: auto`` never drops an engine silently: one that cannot run here is passed over with its reason,
which the engine's status (``/health``, the Training tab) and the log carry."""
from __future__ import annotations

import logging

import pytest

from rlhf.config import apply_overrides
from rlhf.serving.interface import EngineUnavailable
from rlhf.serving.policy_server import start_engine
from rlhf.serving.process import EngineSpec
from rlhf.serving.startup import engine_specs, loop_settings

NOT_HERE = EngineSpec("llama_cpp", {}, "llama.cpp", unavailable="its base cannot be had here (a reason)")


@pytest.fixture
def transformers_spec(app_config) -> EngineSpec:
    (spec,), _ = engine_specs(apply_overrides(app_config, {"serving.engine": "transformers"}), "cpu")
    return spec


@pytest.fixture
def offline_empty_hub(monkeypatch, tmp_path):
    """The Hub switched off over an empty Hugging Face cache (where huggingface_hub keeps both settings)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def test_auto_keeps_llama_cpp_with_the_reason_it_cannot_serve(app_config, offline_empty_hub):
    config = apply_overrides(app_config, {"base_model": "someone/not-cached"})
    specs, _ = engine_specs(config, "cpu")
    first = specs[0]
    assert (first.name, first.label) == ("llama_cpp", "llama.cpp") and first.unavailable
    assert "llama-cpp-python is not installed" in first.unavailable or "someone/not-cached" in first.unavailable
    assert [s.name for s in specs[1:]] == ["transformers"]
    with pytest.raises(EngineUnavailable, match="serving.engine=llama_cpp cannot run here"):  # explicit: it stops
        engine_specs(apply_overrides(config, {"serving.engine": "llama_cpp"}), "cpu")


def test_an_engine_passed_over_in_the_apps_process_is_named_with_its_reason(app_config, transformers_spec):
    engine = start_engine([NOT_HERE, transformers_spec], "thread", loop_settings(app_config))
    try:
        assert engine.name == "transformers"
        assert engine.status == "transformers (in the app's process); llama.cpp: its base cannot be had here " \
                                "(a reason)"
    finally:
        engine.close()
    with pytest.raises(EngineUnavailable, match="no serving engine works here; llama.cpp: its base cannot"):
        start_engine([NOT_HERE], "thread", loop_settings(app_config))


@pytest.mark.slow  # an engine process starts for real
def test_an_engine_passed_over_before_its_process_starts_is_named_with_its_reason(app_config, transformers_spec,
                                                                                  caplog):
    with caplog.at_level(logging.WARNING, logger="rlhf.serving.process"):
        engine = start_engine([NOT_HERE, transformers_spec], "process", loop_settings(app_config))
    try:
        assert engine.name == "transformers"
        assert engine.status.startswith("transformers (proved in its own process: ")
        assert engine.status.endswith("; llama.cpp: its base cannot be had here (a reason)")
        assert "serving engine llama.cpp cannot serve here: its base cannot be had here" in caplog.text
    finally:
        engine.close()
