"""Per-step training metrics: ``metrics.csv`` in the run dir, mirrored through accelerate's trackers
(TensorBoard / W&B / Trackio) when ``ppo.report_to`` names one.

Keys are namespaced and identical everywhere (CLI, Store, plots, this CSV).
"""
from __future__ import annotations

import csv
import importlib.util
import math
from pathlib import Path
from typing import Optional

from rlhf.config import ConfigError

METRIC_KEYS = ("reward/mean", "reward/std", "ppo/kl", "ppo/kl_coef", "ppo/approx_kl", "ppo/clipfrac",
               "loss/policy", "loss/value", "ppo/entropy", "ppo/response_length", "time/generate", "time/score",
               "time/reference", "time/update", "perf/tokens_per_s", "eval/reward", "eval/kl")
REPORTERS = {"none": None, "tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


def check_report_to(report_to: str) -> None:
    """ConfigError when ``ppo.report_to`` is unknown or its package is not installed."""
    if report_to not in REPORTERS:
        raise ConfigError(f"ppo.report_to must be one of {', '.join(REPORTERS)}, got {report_to!r}")
    package = REPORTERS[report_to]
    if package and importlib.util.find_spec(package) is None:
        raise ConfigError(f"ppo.report_to={report_to} needs the {package!r} package: pip install {package}")


def tracker_for(report_to: str):
    """What ``Accelerator(log_with=...)`` gets for ``ppo.report_to``: None for "none", else the tracker's name."""
    check_report_to(report_to)
    return REPORTERS[report_to] and report_to


def start_trackers(acc, report_to: str, run_name: str, run_config: dict) -> None:
    """Start the Accelerator's trackers (if any) with the run's config flattened to scalars."""
    if acc.log_with:
        acc.init_trackers("rlhf-studio", config=flat_scalars(run_config),
                          init_kwargs={"wandb": {"name": run_name}})


def flat_scalars(tree: dict, prefix: str = "") -> dict:
    """``{"ppo": {"steps": 8}}`` -> ``{"ppo.steps": 8}``; lists and dicts inside become strings (hparams)."""
    flat: dict = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            flat.update(flat_scalars(value, name + "."))
        elif isinstance(value, (bool, int, float, str)) or value is None:
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


def finite_numbers(metrics: dict) -> dict:
    """The metrics a tracker can plot: finite ints and floats."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class MetricsLog:
    """Appends one row per step to ``metrics.csv`` (the record the app reads; trackers only mirror it)."""

    def __init__(self, run_dir: Path, resume_step: int = 0):
        self.path = Path(run_dir) / "metrics.csv"
        self.columns: Optional[list[str]] = None
        if self.path.exists():
            self._truncate_after(resume_step)

    def _truncate_after(self, step: int) -> None:
        # A resumed run repeats the steps after its checkpoint: drop their old rows first.
        with self.path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows:
            return
        self.columns = list(rows[0].keys())
        with self.path.open("w", newline="") as f:
            writer = csv.DictWriter(f, self.columns)
            writer.writeheader()
            writer.writerows(r for r in rows if int(r["step"]) <= step)

    def log(self, step: int, metrics: dict) -> None:
        """Write one step's metrics (missing known keys are left blank)."""
        if self.columns is None:
            extra = sorted(k for k in metrics if k not in METRIC_KEYS)
            self.columns = ["step", *METRIC_KEYS, *extra]
            with self.path.open("w", newline="") as f:
                csv.DictWriter(f, self.columns).writeheader()
        row = {"step": step, **{k: v for k, v in metrics.items() if k in self.columns}}
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, self.columns).writerow(row)


def read_metrics(run_dir: Path) -> list[dict]:
    """Rows of ``metrics.csv`` with numbers parsed (blank = None)."""
    path = Path(run_dir) / "metrics.csv"
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return [{k: (int(v) if k == "step" else (float(v) if v != "" else None)) for k, v in r.items()}
                for r in csv.DictReader(f)]
