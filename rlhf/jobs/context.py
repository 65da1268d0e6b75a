"""What a running job may use: the Store, its record and config, progress/metrics/log reporting, and cancel."""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from rlhf.config import AppConfig
from storage import Job, Store

log = logging.getLogger("rlhf.jobs.worker")


class JobCancelled(Exception):
    """Raised inside a job when someone asked to cancel it."""


@dataclass
class JobContext:
    """What a running job may use: the Store, its record and config, and progress/metrics/log reporting."""

    store: Store
    job: Job
    config: AppConfig
    cancel_event: threading.Event = field(default_factory=threading.Event)
    _last_progress: float = 0.0

    @property
    def job_id(self) -> int:
        return self.job.id

    @property
    def data_dir(self) -> Path:
        return self.config.data_path

    def check_cancel(self) -> None:
        """Raise JobCancelled if a cancel was requested."""
        if self.cancel_event.is_set():
            raise JobCancelled(f"job {self.job.id} was cancelled")

    def progress(self, fraction: Optional[float] = None, phase: Optional[str] = None, message: Optional[str] = None,
                 checkpoint: Optional[str] = None) -> None:
        """Report progress (0–1) and phase; raises JobCancelled when a cancel was requested."""
        if fraction is not None:
            self._last_progress = max(self._last_progress, min(1.0, fraction))
        if self.store.job_progress(self.job.id, self._last_progress if fraction is not None else None, phase,
                                   message, checkpoint):
            self.cancel_event.set()
        if phase or message:
            self.log(f"[{phase or ''}] {message or ''}".strip())
        self.check_cancel()

    def metrics(self, step: int, values: dict) -> None:
        """Store one step's namespaced metrics for the dashboard."""
        self.store.log_metrics(self.job.id, step, values)

    def log(self, line: str, level: str = "info") -> None:
        self.store.log_job(self.job.id, line, level)
        log.log(logging.WARNING if level == "warning" else logging.INFO, "job %s: %s", self.job.id, line)
