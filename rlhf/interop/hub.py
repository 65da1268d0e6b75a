"""A version as a Hugging Face model: a folder (or zip) other tools load, and a push to a Hub repo.

The folder holds the PEFT adapter (``adapter_config.json`` naming its base by hub id when it has one, the
weights), the tokenizer with its chat template and the GGUF LoRA (``rlhf.retrain.bundle``), and a fresh model
card (``rlhf.retrain.model_card``: the arena rating as it is now). The app's own
``version.json`` (job, reward model, the local base path) stays home.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

from rlhf.config import AppConfig
from rlhf.files import atomic_dir
from rlhf.retrain import bundle
from rlhf.retrain.model_card import base_of, read_adapter_meta, write_card
from storage import Policy, Store



class HubError(RuntimeError):
    """A version that cannot be exported or pushed; the message says why."""


def adapter_of(store: Store, policy_id: int) -> Policy:
    """The version, refused when it has no adapter (version 0 is the base itself) or its adapter is gone."""
    policy = store.get_policy(policy_id)
    if policy.adapter_path is None:
        raise HubError(f"version {policy.version} (policy {policy.id}) is the base model itself: there is no "
                       "adapter to share")
    if not (Path(policy.adapter_path) / "adapter_config.json").is_file():
        raise HubError(f"policy {policy.id}'s adapter is missing from {policy.adapter_path}")
    return policy


def export_version(store: Store, policy_id: int, out: str | Path, repo_id: Optional[str] = None,
                   with_system_prompt: bool = False) -> Path:
    """Write the version as a Hub-ready folder ``out`` (new): adapter files and its card (written for ``repo_id``;
    quoting the agent's system prompt only ``with_system_prompt``)."""
    policy = adapter_of(store, policy_id)
    src, out = Path(policy.adapter_path), Path(out)
    if out.exists():
        raise HubError(f"{out} already exists")
    with atomic_dir(out, replace=False) as tmp:
        for path in bundle.travel_files(src):
            shutil.copy2(path, tmp / path.name)
        if not bundle.has_tokenizer(src):  # published before versions held their tokenizer and GGUF LoRA
            from rlhf.base_models import resolve_model

            bundle.complete(tmp, resolve_model(store.get_agent(policy.agent_id).base_model, store.root))
        adapter_cfg, meta = read_adapter_meta(src)
        hub, _ = base_of(adapter_cfg, meta, store.get_agent(policy.agent_id).base_model, store.root)
        if hub and adapter_cfg.get("base_model_name_or_path") != hub:  # published before bases had hub ids
            adapter_cfg["base_model_name_or_path"] = hub
            (tmp / "adapter_config.json").write_text(json.dumps(adapter_cfg, indent=2, sort_keys=True) + "\n")
        write_card(store, policy, tmp, repo_id, with_system_prompt)
    return out


def zip_version(store: Store, policy_id: int, dest_dir: str | Path) -> Path:
    """The version as one zip in ``dest_dir`` (for a download): ``<agent>-v<N>.zip``."""
    policy = adapter_of(store, policy_id)
    name = f"{store.get_agent(policy.agent_id).name}-v{policy.version}"
    folder = export_version(store, policy_id, Path(dest_dir) / name)
    try:
        return Path(shutil.make_archive(str(Path(dest_dir) / name), "zip", root_dir=folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def push_policy(store: Store, config: AppConfig, policy_id: int, repo: str, private: bool = True,
                with_system_prompt: bool = False) -> dict:
    """Create the Hub repo ``repo`` (private by default) if needed and commit the version to it. Unless ``private``
    is False (``--public``), a repo that exists and is public is refused before anything is pushed."""
    import tempfile

    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.errors import HfHubHTTPError

    token = config.server.hf_token
    if not token:
        raise HubError("pushing needs a Hugging Face token with write access: set HF_TOKEN (or server.hf_token)")
    policy = adapter_of(store, policy_id)
    api = HfApi(endpoint=config.server.hf_endpoint or None, token=token)
    with tempfile.TemporaryDirectory(prefix="rlhf-push-") as work:
        folder = export_version(store, policy.id, Path(work) / "model", repo_id=repo,
                                with_system_prompt=with_system_prompt)
        files = sorted(p.name for p in folder.iterdir())
        try:
            url = api.create_repo(repo, private=private, exist_ok=True, repo_type="model")
            if private and api.repo_info(url.repo_id, repo_type="model").private is not True:
                raise HubError(f"{url.repo_id} already exists and is public; nothing was pushed. Make it private on "
                               "the Hub, or pass --public to publish this version to everyone")
            ops = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(folder / name)) for name in files]
            agent = store.get_agent(policy.agent_id).name
            commit = api.create_commit(url.repo_id, ops, commit_message=f"{agent} v{policy.version} from RLHF Studio",
                                       repo_type="model")
        except (HfHubHTTPError, OSError, ValueError) as exc:
            raise HubError(f"pushing to {repo} failed: {exc}") from exc
    return {"policy_id": policy.id, "version": policy.version, "repo": url.repo_id, "url": str(url),
            "commit": commit.oid, "files": files}
