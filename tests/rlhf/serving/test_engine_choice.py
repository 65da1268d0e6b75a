"""``serving.engine: auto`` never drops an engine silently: one that cannot run here is passed over with its reason,
which the engine's status (``/health``, the Training tab) and the log carry."""
from __future__ import annotations

import dataclasses
import logging
import sys
import types

import pytest

from rlhf.config import ConfigError, apply_overrides
from rlhf.serving import interface
from rlhf.serving.interface import Backend, EngineUnavailable
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


def fake_backend(monkeypatch, name: str, unavailable: str = "", auto_devices=None) -> Backend:
    """A registry entry whose spec module (registered in ``sys.modules`` for the test) offers one spec."""
    module = types.ModuleType(f"fake_backend_{name}")
    module.options = lambda config: {"colour": name}
    module.specs = lambda source, device, data_dir, tokenizer_source=None, **options: [
        EngineSpec(name, {"source": source, "device": device, "tokenizer_source": tokenizer_source or f"{name}-tok",
                          **options}, name, unavailable=unavailable)]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return Backend(f"{module.__name__}:build", module.__name__, auto_devices)


@pytest.fixture
def registry(monkeypatch):
    """The registry replaced by fake backends for one test (the same dict, so every importer sees them), then
    restored in its own order."""
    saved = dict(interface.ENGINES)
    interface.ENGINES.clear()
    interface.ENGINES.update({"gone": fake_backend(monkeypatch, "gone", unavailable="not here (a reason)"),
                              "cpu_only": fake_backend(monkeypatch, "cpu_only", auto_devices=("cpu",)),
                              "everywhere": fake_backend(monkeypatch, "everywhere")})
    yield interface.ENGINES
    interface.ENGINES.clear()
    interface.ENGINES.update(saved)


def test_auto_tries_the_registry_in_its_order_and_explicit_engines_alone(app_config, registry):
    specs, tokenizer_source = engine_specs(app_config, "cpu")
    assert [(s.name, s.unavailable) for s in specs] == [("gone", "not here (a reason)"), ("cpu_only", ""),
                                                        ("everywhere", "")]
    assert tokenizer_source == "cpu_only-tok"  # the first engine that can run names the tokenizer ...
    assert specs[2].settings["tokenizer_source"] == "cpu_only-tok"  # ... and the engines after it use it too
    assert [s.settings["colour"] for s in specs[1:]] == ["cpu_only", "everywhere"]  # each backend's own options
    assert [s.name for s in engine_specs(app_config, "cuda")[0]] == ["gone", "everywhere"]
    app_config.serving.engine = "everywhere"
    assert [s.name for s in engine_specs(app_config, "cpu")[0]] == ["everywhere"]
    app_config.serving.engine = "gone"
    with pytest.raises(EngineUnavailable, match=r"serving.engine=gone cannot run here: not here \(a reason\)"):
        engine_specs(app_config, "cpu")


def test_an_unknown_engine_is_refused_never_served_by_transformers(app_config):
    with pytest.raises(ConfigError, match="serving.engine"):
        apply_overrides(app_config, {"serving.engine": "vllm"})
    app_config.serving.engine = "vllm"  # past the config's check: the registry still refuses it
    with pytest.raises(ValueError, match="unknown serving engine 'vllm'"):
        engine_specs(app_config, "cpu")
    with pytest.raises(ValueError, match="unknown serving engine 'vllm'"):
        interface.build_core("vllm")


def test_the_config_offers_the_registrys_engines():
    from rlhf.config import ServingConfig
    from rlhf.registry import ENGINE_CHOICES

    assert ENGINE_CHOICES == ("auto", *interface.ENGINES)
    help_text = next(f.metadata["help"] for f in dataclasses.fields(ServingConfig) if f.name == "engine")
    assert help_text.startswith(" | ".join(ENGINE_CHOICES) + ":")
