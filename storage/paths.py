"""Paths the Store keeps are relative to the data dir, so a data dir can be moved, copied or restored elsewhere.

The data dir is the directory that holds the database file; ``DataDir`` names every path in it, once (nothing
else spells ``studio.db`` or ``reward_models``). A path under it is stored relative (POSIX separators); a path
outside it (a base model or adapter the user keeps elsewhere) stays absolute. Records handed out by the Store carry
absolute paths again, so callers never see the difference.
"""
from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Optional


class DataDir:
    """Every path in a data dir::

        studio.db (+ -wal, -shm)   the database
        policies/<agent>/<name>/   published versions (LoRA adapters), written by ``rlhf.retrain.publish``
        reward_models/rm-*/        reward models, written by ``rlhf.training.reward``
        runs/<name>/               PPO and DPO run dirs (checkpoints, metrics); a retrain's is ``runs/job<id>``
        jobs/<id>.log              each job process's output
        models/<name>/             converted base models (shipped GGUF or a local .gguf, as safetensors)
        tokenizers/<name>/         tokenizers of bases not converted (yet)
        gguf/                      bases and adapters converted for the llama.cpp engine (its own layout)
        serving/verdicts.json      which serving engines this machine's CPU can run
    """

    DATABASE = "studio.db"
    POLICIES, REWARD_MODELS, RUNS, JOBS = "policies", "reward_models", "runs", "jobs"
    MODELS, TOKENIZERS, GGUF, SERVING = "models", "tokenizers", "gguf", "serving"
    VERDICTS = "verdicts.json"  # in ``serving/``
    # The sub-directories a stored path can live in (``from_legacy`` finds them in an old absolute path).
    STORED_TREES = (POLICIES, REWARD_MODELS, RUNS)
    # The sub-directories that travel in a backup (with the database); a restore also replaces ``runs``.
    BACKED_UP = (POLICIES, REWARD_MODELS)
    # The kinds of file the app writes into those trees (adapters, reward models, tokenizers, model cards): data a
    # restore may bring back. Anything else (``.py``, pickles such as ``.bin``/``.pt``, libraries) is not ours.
    ARTEFACT_SUFFIXES = (".json", ".jsonl", ".safetensors", ".npz", ".md", ".txt", ".jinja", ".model")

    @classmethod
    def is_artefact(cls, name: str) -> bool:
        """True for the archive name (POSIX, relative) of a file the app writes: the database, or a data file
        under a backed-up tree."""
        parts = PurePosixPath(name).parts
        if name == cls.DATABASE:
            return True
        return len(parts) > 1 and parts[0] in cls.BACKED_UP and PurePosixPath(name).suffix in cls.ARTEFACT_SUFFIXES

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"DataDir({str(self.root)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, DataDir) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    @classmethod
    def of_database(cls, db_path: str | os.PathLike) -> "DataDir":
        """The data dir that holds the database ``db_path``."""
        return cls(Path(os.path.abspath(db_path)).parent)

    @classmethod
    def of_reward_model(cls, path: str | os.PathLike) -> Optional["DataDir"]:
        """The data dir a reward-model directory was written into (None when it lies elsewhere)."""
        path = Path(os.path.abspath(path))
        return cls(path.parent.parent) if path.parent.name == cls.REWARD_MODELS else None

    # ---- the database --------------------------------------------------------------------------
    @property
    def db(self) -> Path:
        return self.root / self.DATABASE

    @property
    def db_files(self) -> tuple[Path, ...]:
        """The database and the files SQLite keeps beside it (WAL, shared memory, rollback journal)."""
        return (self.db, *(self.root / f"{self.DATABASE}-{x}" for x in ("wal", "shm", "journal")))

    # ---- what training and publishing write ---------------------------------------------------
    @property
    def policies(self) -> Path:
        return self.root / self.POLICIES

    def agent_policies(self, agent: str) -> Path:
        """The directory of one agent's published versions."""
        return self.policies / agent

    @property
    def reward_models(self) -> Path:
        return self.root / self.REWARD_MODELS

    @property
    def runs(self) -> Path:
        return self.root / self.RUNS

    def run(self, name: str) -> Path:
        return self.runs / name

    def job_run(self, job_id: int) -> Path:
        """The run dir of a job's policy training (a re-queued job finds its checkpoints there)."""
        return self.run(f"job{job_id}")

    @property
    def job_logs(self) -> Path:
        return self.root / self.JOBS

    def job_log(self, job_id: int) -> Path:
        return self.job_logs / f"{job_id}.log"

    # ---- caches of base models and serving ---------------------------------------------------
    @property
    def models(self) -> Path:
        return self.root / self.MODELS

    def model(self, name: str) -> Path:
        return self.models / name

    def tokenizer(self, name: str) -> Path:
        return self.root / self.TOKENIZERS / name

    @property
    def gguf(self) -> Path:
        return self.root / self.GGUF

    @property
    def serving_verdicts(self) -> Path:
        return self.root / self.SERVING / self.VERDICTS


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
    anchors = [i for i, part in enumerate(parts) if part in DataDir.STORED_TREES]
    if anchors and (Path(root) / Path(*parts[anchors[-1]:])).exists():
        return PurePosixPath(*parts[anchors[-1]:]).as_posix()
    return os.path.abspath(p)
