"""Run directories on disk: checkpoints, best/ and final/, each written to a temp dir and renamed.

A checkpoint holds everything needed to continue a PPO run exactly: the LoRA adapter (PEFT format, so
it can also be served), the value head, the optimizer, RNG states and the trainer state (step, KL
coefficient, guard events, metrics history). ``best/`` and ``final/`` hold ``adapter/`` (loadable by
``PeftModel.from_pretrained`` and ``PolicyServer.ensure_adapter``), ``value_head.pt`` and ``info.json``.
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Optional

import torch

from rlhf.files import atomic_dir

STEP_DIR = re.compile(r"^step-(\d+)$")
CHECKPOINTS = "checkpoints"  # a run dir's sub-directory of step-N checkpoints


def checkpoints_dir(run_dir: Path) -> Path:
    """Where a run dir keeps its step checkpoints (present once a run saved one: the run can be resumed)."""
    return Path(run_dir) / CHECKPOINTS


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))


def save_policy(model, target: Path, info: dict) -> Path:
    """Write ``adapter/`` + ``value_head.pt`` + ``info.json`` of a PolicyWithValue atomically to ``target``."""
    with atomic_dir(target) as tmp:
        model.policy.save_pretrained(tmp / "adapter")
        torch.save(model.value_head.state_dict(), tmp / "value_head.pt")
        _write_json(tmp / "info.json", info)
    return Path(target)


def load_policy_weights(model, source: Path) -> None:
    """Load the adapter and value head written by ``save_policy``/``save_checkpoint`` into ``model``."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    source = Path(source)
    weights = source / "adapter" / "adapter_model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"no adapter weights in {source}/adapter")
    set_peft_model_state_dict(model.policy, load_file(str(weights)))
    model.value_head.load_state_dict(torch.load(source / "value_head.pt", map_location="cpu"))


def rng_state() -> dict:
    """Python, torch (and CUDA) RNG states."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore states from ``rng_state``."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: Path, step: int, model, optimizer, trainer_state: dict) -> Path:
    """``run_dir/checkpoints/step-NNNNNN``: adapter, value head, optimizer, RNG and trainer state."""
    target = checkpoints_dir(run_dir) / f"step-{step:06d}"
    with atomic_dir(target) as tmp:
        model.policy.save_pretrained(tmp / "adapter")
        torch.save(model.value_head.state_dict(), tmp / "value_head.pt")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        _write_json(tmp / "trainer_state.json", {**trainer_state, "step": step})
    return target


def load_checkpoint(checkpoint: Path, model, optimizer) -> dict:
    """Restore a checkpoint into ``model`` and ``optimizer``; returns the trainer state (with ``step``)."""
    checkpoint = Path(checkpoint)
    load_policy_weights(model, checkpoint)
    optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", map_location="cpu"))
    # Our own file: it holds Python's RNG tuple, which the weights-only unpickler refuses.
    set_rng_state(torch.load(checkpoint / "rng.pt", map_location="cpu", weights_only=False))
    return json.loads((checkpoint / "trainer_state.json").read_text())


def find_checkpoint(path: Path) -> Optional[Path]:
    """``path`` itself when it is a checkpoint, else the newest checkpoint of the run dir ``path``."""
    path = Path(path)
    if (path / "trainer_state.json").is_file():
        return path
    steps = [(int(m.group(1)), p) for p in checkpoints_dir(path).glob("step-*")
             if (m := STEP_DIR.match(p.name)) and (p / "trainer_state.json").is_file()]
    return max(steps)[1] if steps else None


def run_dir_of(checkpoint: Path) -> Path:
    """The run directory a checkpoint belongs to."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINTS else checkpoint
