"""The one rule for writing a directory other processes may read: build it under a temp name, then rename.

A reader (or a restart) sees the directory complete or not at all. Temp dirs are named ``.<name>.tmp-*``
beside the target, so the start-up cleanup (``rlhf.retrain.publish.clean_leftovers``) can find the ones a
killed process left behind.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

TEMP_MARK = ".tmp-"


def is_temp_dir(path: Path) -> bool:
    """True for a temp dir ``atomic_dir`` (or an older release) left behind."""
    return path.name.startswith(".") and (TEMP_MARK in path.name or path.name.startswith(".rm-"))


@contextlib.contextmanager
def atomic_dir(target: str | Path, replace: bool = True) -> Iterator[Path]:
    """Yield a temp dir beside ``target``; on success it becomes ``target`` in one rename.

    ``replace`` swaps out an existing ``target`` (the old copy is removed only once the new one is in place);
    without it an existing ``target`` raises FileExistsError and nothing changes.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}{TEMP_MARK}", dir=target.parent))
    try:
        yield tmp
        if target.exists() and not replace:
            raise FileExistsError(f"{target} already exists")
        old = None
        if target.exists():  # keep the old copy until the new one is in place
            old = target.parent / f".{target.name}.old-{os.getpid()}"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(target, old)
        os.rename(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_file(target: str | Path) -> Iterator[Path]:
    """Yield a temp file path beside ``target``; on success it replaces ``target`` in one rename."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}{TEMP_MARK}", dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
