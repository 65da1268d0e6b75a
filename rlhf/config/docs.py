"""The config as documentation: every key with its default and help (docs/configuration.md's table), and as YAML."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import yaml

from rlhf.config.app import SECTIONS, AppConfig
from rlhf.config.fields import default_of


def describe() -> list[tuple[str, Any, str]]:
    """(dotted key, default, help) for every field: docs/configuration.md's table comes from this."""
    rows = []
    for f in dataclasses.fields(AppConfig):
        if f.name in SECTIONS:
            for sf in dataclasses.fields(f.default_factory()):
                help = sf.metadata.get("help", "")
                if "group" in sf.metadata:
                    help = f"*{sf.metadata['group']}* · {help}"
                rows.append((f"{f.name}.{sf.name}", default_of(sf), help))
        else:
            rows.append((f.name, f.default, f.metadata.get("help", "")))
    return rows


def to_yaml(cfg: AppConfig) -> str:
    """The effective config as YAML."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def markdown_table() -> str:
    """The manual's config reference (``rlhf-studio config docs`` prints it)."""
    lines = ["| key | default | env | what it does |", "|---|---|---|---|"]
    for key, default, help in describe():
        shown = json.dumps(default) if not isinstance(default, str) else (default or '""')
        env = "RLHF_" + key.replace(".", "_").upper()
        lines.append(f"| `{key}` | `{shown}` | `{env}` | {help} |")
    return "\n".join(lines) + "\n"
