"""Per-step training metrics: ``metrics.csv`` in the run dir, mirrored to TensorBoard / W&B / Trackio.

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


class MetricsLog:
    """Appends one row per step to ``metrics.csv`` and mirrors it to the configured tracker."""

    def __init__(self, run_dir: Path, report_to: str = "none", run_config: Optional[dict] = None,
                 resume_step: int = 0):
        check_report_to(report_to)
        self.path = Path(run_dir) / "metrics.csv"
        self.columns: Optional[list[str]] = None
        if self.path.exists():
            self._truncate_after(resume_step)
        self.report_to = report_to
        self._tracker = self._open_tracker(report_to, Path(run_dir), run_config or {})

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

    @staticmethod
    def _open_tracker(report_to: str, run_dir: Path, run_config: dict):
        if report_to == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            return SummaryWriter(str(run_dir / "tensorboard"))
        if report_to in ("wandb", "trackio"):
            module = __import__(report_to)
            module.init(project="rlhf-studio", name=run_dir.name, config=run_config)
            return module
        return None

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
        finite = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        if self.report_to == "tensorboard":
            for key, value in finite.items():
                self._tracker.add_scalar(key, value, step)
            self._tracker.flush()
        elif self._tracker is not None:
            self._tracker.log(finite, step=step)

    def close(self) -> None:
        """Flush and close the tracker."""
        if self.report_to == "tensorboard":
            self._tracker.close()
        elif self._tracker is not None:
            self._tracker.finish()


def read_metrics(run_dir: Path) -> list[dict]:
    """Rows of ``metrics.csv`` with numbers parsed (blank = None)."""
    path = Path(run_dir) / "metrics.csv"
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return [{k: (int(v) if k == "step" else (float(v) if v != "" else None)) for k, v in r.items()}
                for r in csv.DictReader(f)]
