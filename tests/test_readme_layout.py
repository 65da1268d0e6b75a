"""The README's map of the tree (*How it fits together*) is checked against the tree: every folder and file it names
exists, and every package folder and every module is on the map. A new, moved or renamed module fails here until
the map follows."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPED = ("rlhf", "ui", "storage", "bench")  # every package folder under these must be on the map
FILE = re.compile(r"(?<![\w./`-])([\w/]+\.(?:py|md|json|yaml))\b")
FOLDER = re.compile(r"(?<![\w./<-])([a-z_]+(?:/[a-z_]+)*)/(?=[\s,)*]|$)")
MODULE = re.compile(r"python -m ([\w.]+)")


def layout() -> dict[str, str]:
    """The map's entries: the path in the left column -> its description (continuation lines joined)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## How it fits together", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            current, _, rest = line.partition(" ")
            entries[current] = rest.strip()
        elif current is not None:
            entries[current] += " " + line.strip()
    return entries


def named_files(entry: str, text: str) -> list[Path]:
    """Files a description names: relative to the entry's folder (or the root, for a top-level file's line)."""
    base = ROOT / entry if entry.endswith("/") else ROOT
    return [base / f for f in FILE.findall(text) if "<" not in f]


def test_every_path_on_the_map_exists():
    missing = []
    for entry, text in layout().items():
        if not (ROOT / entry).exists():
            missing.append(entry)
        for path in named_files(entry, text):
            if not path.exists():
                missing.append(f"{path.relative_to(ROOT)} (named under {entry})")
        if entry.endswith("/"):
            missing += [f"{entry}{d}/" for d in FOLDER.findall(text) if not (ROOT / entry / d).is_dir()]
        for module in MODULE.findall(text):
            parts = module.split(".")
            if not ((ROOT / Path(*parts)).with_suffix(".py").exists() or (ROOT / Path(*parts)).is_dir()):
                missing.append(f"python -m {module} (under {entry})")
    assert not missing, f"the README's map names what the tree does not have: {missing}"


def test_every_package_folder_is_on_the_map():
    entries = layout()
    unmapped = []
    for top in MAPPED:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            folder = init.parent.relative_to(ROOT).as_posix() + "/"
            parent = folder.rstrip("/").rpartition("/")[0] + "/"
            mentioned = folder in entries or f"{folder.rstrip('/').rpartition('/')[2]}/" in entries.get(parent, "")
            if not mentioned:
                unmapped.append(folder)
    assert not unmapped, f"package folders missing from the README's map: {unmapped}"


def mentions(entries: dict[str, str], path: Path) -> bool:
    """Whether the map names ``path`` (a module): under its own folder's entry, or as ``sub/name.py`` under an
    ancestor's entry."""
    rel = path.relative_to(ROOT)
    for depth in range(len(rel.parts) - 1, 0, -1):
        entry = "/".join(rel.parts[:depth]) + "/"
        tail = "/".join(rel.parts[depth:])
        if entry in entries and any((ROOT / entry / f) == path for f in FILE.findall(entries[entry])
                                    if f.endswith(tail)):
            return True
    return False


def test_every_module_is_on_the_map():
    entries = layout()
    unnamed = [p.relative_to(ROOT).as_posix() for top in MAPPED for p in sorted((ROOT / top).rglob("*.py"))
               if p.name != "__init__.py" and "__pycache__" not in p.parts and not mentions(entries, p)]
    assert not unnamed, f"modules the README's map does not name: {unnamed}"


def test_the_map_checker_catches_a_wrong_name():
    assert [p.name for p in named_files("ui/", "app.py (the Blocks), plots.py")] == ["app.py", "plots.py"]
    assert not (ROOT / "ui" / "plots.py").exists()
    assert FOLDER.findall("config/ (one dataclass), transformers/ and llama_cpp/") == ["config", "transformers",
                                                                                   "llama_cpp"]


def test_the_map_checker_catches_an_unnamed_module():
    entries = {"rlhf/": "prompting.py (the encoder)", "rlhf/serving/": "loop.py"}
    assert mentions(entries, ROOT / "rlhf" / "prompting.py")
    assert mentions(entries, ROOT / "rlhf" / "serving" / "loop.py")
    assert not mentions(entries, ROOT / "rlhf" / "serving" / "process.py")
    assert not mentions(entries, ROOT / "rlhf" / "cpu.py")
