"""Dashboard: download a version as a zip (PEFT adapter, tokenizer, GGUF LoRA, model card), admins only."""
from __future__ import annotations

import zipfile
from pathlib import Path

import gradio as gr

from rlhf.retrain.publish import publish_version
from tests.conftest import make_adapter
from ui.auth import Auth
from ui.tabs import dashboard


def test_an_admin_downloads_a_version_and_an_annotator_cannot(services, tiny_model_dir, tmp_path):
    store = services.store
    base = store.active_policy("assistant")
    v1 = publish_version(store, services.config, "assistant", make_adapter(tiny_model_dir, tmp_path / "a", seed=2),
                         parent_id=base.id, promote=False)
    button, status = dashboard.download_version(services, v1.id, None)  # local mode: everyone is admin
    path = Path(button.value["path"])
    assert button.visible and path.name == "assistant-v1.zip" and "PeftModel" in status
    assert {"README.md", "adapter_config.json", "adapter_model.safetensors", "adapter_model.gguf", "tokenizer.json",
            "tokenizer_config.json"} <= set(zipfile.ZipFile(path).namelist())
    button, status = dashboard.download_version(services, base.id, None)
    assert not button.visible and "base model itself" in status
    button, status = dashboard.download_version(services, None, None)
    assert not button.visible and "Pick a version" in status
    services.auth = Auth(store, "users", {"alice": "admin", "bob": "annotator"})
    button, status = dashboard.download_version(services, v1.id, gr.Request(username="bob"))
    assert not button.visible and "admin" in status
