"""Publishing a policy version atomically: directory first (temp name + rename), then ONE Store transaction.

A crash before the rename leaves only a ``.tmp-*`` directory (removed at the next start); a crash
between the rename and the insert leaves an unreferenced directory (also removed). A half-written
version is never listed or served.
"""
from __future__ import annotations

import json
import logging
import shutil
import uuid
from pathlib import Path
from typing import Optional

from rlhf.config import AppConfig
from rlhf.files import atomic_dir, is_temp_dir
from storage import Policy, Store

log = logging.getLogger(__name__)


def policies_root(config: AppConfig) -> Path:
    return config.data_path / "policies"


def publish_version(store: Store, config: AppConfig, agent: str, adapter_dir: str | Path, parent_id: Optional[int],
                    promote: bool, job_id: Optional[int] = None, reward_model_id: Optional[int] = None,
                    data_snapshot: Optional[dict] = None, run_config: Optional[dict] = None,
                    metrics: Optional[dict] = None, name: Optional[str] = None) -> Policy:
    """Copy a PEFT adapter into the data dir under a temp name, rename it, then register the version."""
    src = Path(adapter_dir)
    if not (src / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{src} is not a PEFT adapter directory (no adapter_config.json)")
    root = policies_root(config) / agent
    root.mkdir(parents=True, exist_ok=True)
    name = name or (f"job{job_id}" if job_id is not None else uuid.uuid4().hex[:12])
    final = root / name
    if final.exists():
        raise FileExistsError(f"{final} already exists")
    with atomic_dir(final, replace=False) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        (tmp / "version.json").write_text(json.dumps({"agent": agent, "parent_id": parent_id, "job_id": job_id,
                                                      "reward_model_id": reward_model_id}, indent=1))
    try:
        return store.register_policy_version(agent, str(final), parent_id=parent_id, promote=promote,
                                             reward_model_id=reward_model_id, job_id=job_id,
                                             data_snapshot=data_snapshot, config=run_config, metrics=metrics)
    except Exception:
        shutil.rmtree(final, ignore_errors=True)
        raise


def clean_leftovers(store: Store, config: AppConfig) -> list[Path]:
    """At start: remove temp dirs and version dirs that no policy row references (an interrupted publish)."""
    rm_root = config.data_path / "reward_models"
    removed = [d for d in rm_root.iterdir() if d.is_dir() and is_temp_dir(d)] if rm_root.is_dir() else []
    for d in removed:  # a reward model whose training was killed before its rename
        shutil.rmtree(d, ignore_errors=True)
    root = policies_root(config)
    if not root.is_dir():
        return removed
    referenced = {str(Path(p.adapter_path).resolve()) for p in store.list_policies() if p.adapter_path}
    for agent_dir in root.iterdir():
        if not agent_dir.is_dir():
            continue
        for d in agent_dir.iterdir():
            if d.is_dir() and (is_temp_dir(d) or str(d.resolve()) not in referenced):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
                log.warning("removed %s: left by an interrupted publish", d)
    return removed


def check_adapters(store: Store) -> list[Policy]:
    """Mark versions whose adapter directory is missing or unreadable as broken (the app serves the rest)."""
    broken = []
    for p in store.list_policies():
        if p.adapter_path is None or p.status == "broken":
            continue
        cfg = Path(p.adapter_path) / "adapter_config.json"
        reason = None
        if not cfg.is_file():
            reason = f"adapter directory missing or incomplete: {cfg} not found"
        else:
            try:
                json.loads(cfg.read_text())
            except (OSError, ValueError) as exc:
                reason = f"adapter_config.json unreadable: {exc}"
            if reason is None and not any(Path(p.adapter_path).glob("adapter_model.*")):
                reason = f"adapter weights missing in {p.adapter_path}"
        if reason:
            broken.append(store.mark_policy_broken(p.id, reason))
            log.warning("policy %s marked broken: %s", p.id, reason)
    return broken
