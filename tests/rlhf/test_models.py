"""Model resolution: shipped GGUF → cached safetensors, local dirs, hub ids, clear errors."""
from __future__ import annotations

import pytest

from rlhf.models import ModelNotFound, cached_model_dir, resolve_model


def test_shipped_model_is_converted_once_and_cached(smol_dir, tmp_path):
    from tests.conftest import CACHE

    assert smol_dir == cached_model_dir("smollm2-135m-instruct", CACHE)
    assert (smol_dir / "config.json").is_file() and (smol_dir / "model.safetensors").is_file()
    stamp = (smol_dir / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("smollm2-135m-instruct", CACHE) == str(smol_dir)  # no second conversion
    assert (smol_dir / "model.safetensors").stat().st_mtime_ns == stamp
    assert not list(smol_dir.parent.glob(".smollm2-135m-instruct.*"))  # no temp dirs left behind


def test_local_directory_is_used_as_is(tiny_model_dir, tmp_path):
    assert resolve_model(str(tiny_model_dir), tmp_path) == str(tiny_model_dir)


def test_hub_id_passes_through_when_hub_allowed(tmp_path):
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct", tmp_path) == "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.mark.parametrize("name", ["no-such-model", "", "./missing-dir"])
def test_unknown_model_error_names_the_three_options(tmp_path, name):
    with pytest.raises(ModelNotFound) as info:
        resolve_model(name, tmp_path, allow_hub=False)
    text = str(info.value)
    assert "smollm2-135m-instruct" in text and "local directory" in text and "Hugging Face model id" in text


def test_directory_without_config_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFound, match="config.json"):
        resolve_model(str(tmp_path / "empty"), tmp_path)
