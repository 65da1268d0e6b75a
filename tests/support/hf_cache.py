"""A Hugging Face cache that stands in for the Hub: a model folder laid out as huggingface_hub writes it
(``models--org--name/blobs/<sha256>``, ``snapshots/<revision>/<file>`` linking to the blob, ``refs/main``), so a
process started with ``HF_HOME`` on it and ``HF_HUB_OFFLINE=1`` finds a hub id there and nowhere else."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

REVISION = "0123456789abcdef0123456789abcdef01234567"  # a commit hash, as refs/main holds


def hf_home_with(root: Path, repo_id: str, model_dir: Path) -> Path:
    """``root`` made an ``HF_HOME`` whose hub cache holds ``model_dir``'s files as ``repo_id``; returns ``root``."""
    repo = Path(root) / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for path in sorted(Path(model_dir).iterdir()):
        if not path.is_file():
            continue
        blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copyfile(path, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / path.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return Path(root)
