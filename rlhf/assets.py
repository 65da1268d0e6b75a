"""The files the app reads at run time from ``assets/`` (the starter prompts, the preference pool, the accelerate
configs), found through ``importlib.resources``: a checkout, an editable install and a wheel read the same files.
``assets`` is a package whose ``package-data`` (pyproject.toml) names exactly ``SHIPPED``.
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

PACKAGE = "assets"
# what the code reads; the screenshots and the bench figures are the docs' and stay in the checkout
SHIPPED = ("prompts.jsonl", "preference_pool.jsonl.gz", "accelerate_cpu2.yaml", "accelerate_multigpu.yaml")


def asset_path(name: str) -> Path:
    """The shipped file ``name`` (one of ``SHIPPED``) as a path on disk, for ``open``, ``gzip`` or a subprocess."""
    if name not in SHIPPED:
        raise ValueError(f"{name!r} is not a shipped asset; known: {', '.join(SHIPPED)}")
    found = files(PACKAGE) / name
    if not isinstance(found, Path):  # a zipped install has no file to hand over; pip installs wheels unzipped
        raise FileNotFoundError(f"asset {name} is inside an archive ({found}); install the package unzipped")
    return found
