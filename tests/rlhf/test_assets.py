"""The files the app reads at run time are found through importlib.resources and ship in a wheel: every name the
code asks ``rlhf.assets.asset_path`` for is in ``SHIPPED``, exists as a resource of the ``assets`` package (the
checkout's top-level assets/), and is matched by pyproject.toml's package-data globs; no runtime module builds a
path to assets/ from its own file."""
from __future__ import annotations

import ast
import tomllib
from fnmatch import fnmatch
from importlib.resources import files

import pytest

from rlhf.assets import PACKAGE, SHIPPED, asset_path
from tests.conftest import ROOT

RUNTIME = ("rlhf", "ui", "storage", "cli")  # what an install carries, beside app.py


def runtime_sources():
    found = [p for top in RUNTIME if (ROOT / top).is_dir() for p in sorted((ROOT / top).rglob("*.py"))]
    return found + [p for p in (ROOT / "app.py", ROOT / "cli.py") if p.is_file()]


def asset_reads(path) -> tuple[list[str], list[int]]:
    """(names passed to ``asset_path`` as literals, lines where a bare ``"assets"`` string builds a path)."""
    names, bare = [], []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "asset_path":
            names += [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip("/") == "assets":
            bare.append(node.lineno)
    return names, bare


def test_every_shipped_asset_is_a_resource_of_the_checkouts_assets_folder():
    for name in SHIPPED:
        resource = files(PACKAGE) / name
        assert resource.is_file(), name
        assert asset_path(name) == ROOT / "assets" / name  # the top-level folder, where the docs point


def test_the_code_reads_assets_only_through_the_helper():
    read, bare = set(), []
    for path in runtime_sources():
        names, where = asset_reads(path)
        read.update(names)
        bare += [] if path == ROOT / "rlhf" / "assets.py" else [f"{path.relative_to(ROOT)}:{n}" for n in where]
    assert not bare, f"paths built to assets/ by hand (use rlhf.assets.asset_path): {bare}"
    assert {"prompts.jsonl", "preference_pool.jsonl.gz"} <= read
    assert read <= set(SHIPPED), f"read but not shipped: {read - set(SHIPPED)}"


def test_the_check_sees_a_hand_built_path(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('from pathlib import Path\nP = Path(__file__).parents[2] / "assets" / "x"\n'
                     'Q = asset_path("prompts.jsonl")\n')
    assert asset_reads(probe) == (["prompts.jsonl"], [2])


def test_pyproject_ships_the_assets_as_package_data():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert PACKAGE in setuptools["packages"]["find"]["include"]
    assert (ROOT / PACKAGE / "__init__.py").is_file()  # a package, so setuptools finds it and ships its data
    globs = setuptools["package-data"][PACKAGE]
    assert not [n for n in SHIPPED if not any(fnmatch(n, g) for g in globs)], globs
    for glob in globs:  # no glob left over from a file that is gone
        assert list((ROOT / PACKAGE).glob(glob)), glob


def test_an_unknown_asset_is_refused():
    with pytest.raises(ValueError, match="not a shipped asset"):
        asset_path("screenshots/chat.png")
