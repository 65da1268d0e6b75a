"""What every config section is made of: ``opt`` fields (default, one line of help, optional group) and the error."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Any, Optional


class ConfigError(ValueError):
    """A config value or key that cannot be used."""


class Checked:
    """Base of every config section: its values are checked as soon as it is built (its own ``check``), and
    ``rlhf.config.check`` runs every section's ``check`` again after a file, overrides or a saved dict set them."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ConfigError naming the key when a value cannot work (a section without rules: nothing)."""


def check_finite(prefix: str, section: object) -> None:
    """Raise ConfigError naming the key of a NaN or infinite number (no rule ``x <= 0`` ever refuses a NaN)."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        values = value.values() if isinstance(value, dict) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise ConfigError(f"{prefix}{f.name} must be a finite number, got {value!r}")


def opt(default: Any, help: str, group: Optional[str] = None) -> Any:
    """A config field with a default, one line of help and, for long sections, the concern it belongs to."""
    metadata = {"help": help, **({"group": group} if group else {})}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def default_of(f: dataclasses.Field) -> Any:
    """A field's default value."""
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def groups(section: type) -> dict[str, str]:
    """Key -> group of every field of ``section`` that names one (the config table in docs/configuration.md shows it)."""
    return {f.name: f.metadata["group"] for f in dataclasses.fields(section) if "group" in f.metadata}


def one_of(key: str, value: Any, allowed: tuple) -> None:
    """Raise ConfigError unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(f"{key} must be one of {', '.join(map(str, allowed))}, got {value!r}")
