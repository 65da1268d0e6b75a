"""Paths the Store keeps are relative to the data dir, so a data dir can be moved, copied or restored elsewhere.

The data dir is the directory that holds the database file. A path under it is stored relative (POSIX
separators); a path outside it (a base model or adapter the user keeps elsewhere) stays absolute. Records
handed out by the Store carry absolute paths again, so callers never see the difference.
"""
from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Optional

# The data dir's own sub-directories a stored path can live in (``rlhf`` writes them; ``runs`` holds checkpoints).
DATA_SUBDIRS = ("policies", "reward_models", "runs")


def _relative_to(path: Path, root: Path) -> Optional[str]:
    """``path`` relative to ``root`` as a POSIX string, or None when it lies outside (symlinks tried both ways)."""
    for p, r in ((Path(os.path.abspath(path)), Path(os.path.abspath(root))), (path.resolve(), root.resolve())):
        try:
            rel = p.relative_to(r)
        except ValueError:
            continue
        return PurePosixPath(*rel.parts).as_posix() if rel.parts else "."
    return None


def to_stored(path: str | os.PathLike, root: str | os.PathLike) -> str:
    """The form a path is stored in: relative to the data dir ``root`` when it lies under it, else absolute.

    A relative ``path`` given by a caller means relative to the working directory, as ``open`` reads it.
    """
    p = Path(path)
    if not p.is_absolute():
        p = Path.cwd() / p
    return _relative_to(p, Path(root)) or os.path.abspath(p)


def to_absolute(stored: Optional[str], root: str | os.PathLike) -> Optional[str]:
    """A stored path as an absolute one (a relative one lies under the data dir ``root``)."""
    if stored is None:
        return None
    p = Path(stored)
    return str(p if p.is_absolute() else Path(os.path.abspath(root)) / p)


def from_legacy(stored: str, root: str | os.PathLike, cwd: Optional[Path] = None) -> str:
    """A path written before paths were relative (absolute, or relative to the app's working directory) in the
    stored form: relative when it lies under ``root``, or when it names one of this data dir's own entries at
    another place (``/old/data/policies/a/job7`` of a data dir copied before this release); else absolute."""
    p = Path(stored)
    if not p.is_absolute():
        p = (cwd or Path.cwd()) / p
    inside = _relative_to(p, Path(root))
    if inside is not None:
        return inside
    parts = p.parts
    anchors = [i for i, part in enumerate(parts) if part in DATA_SUBDIRS]
    if anchors and (Path(root) / Path(*parts[anchors[-1]:])).exists():
        return PurePosixPath(*parts[anchors[-1]:]).as_posix()
    return os.path.abspath(p)
