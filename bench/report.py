"""Shared benchmark reporting: a table on stdout, machine info + figures appended to BENCHMARKS.md,
and ONE JSON line printed last (what scripts parse)."""
from __future__ import annotations

import json
import os
import platform
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]


def machine_info() -> dict:
    """CPU/GPU, cores, memory, library versions: enough to compare figures across machines."""
    import torch
    import transformers

    info = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "torch_threads": torch.get_num_threads(), "gpu": None}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        with open("/proc/meminfo") as f:
            info["mem_gb"] = round(int(f.readline().split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return info


def markdown(rows: Sequence[dict]) -> str:
    """Rows of equal keys as a Markdown table."""
    if not rows:
        return "(no rows)\n"
    keys = list(rows[0])
    fmt = lambda v: (f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}") if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def report(name: str, rows: Sequence[dict], figures: dict, notes: str = "",
           path: Path | None = None) -> dict:
    """Print the table, append a dated section to BENCHMARKS.md, print the JSON line last."""
    table = markdown(rows)
    print(table, file=sys.stderr)
    path = path or ROOT / "BENCHMARKS.md"
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = (f"\n## {name} — {stamp}\n\nMachine: `{json.dumps(machine_info(), sort_keys=True)}`\n\n"
               f"{table}\n{notes + chr(10) if notes else ''}Figures: `{json.dumps(figures, sort_keys=True)}`\n")
    if not path.exists():
        path.write_text("# Benchmarks\n\nEach section is appended by `rlhf-studio bench ...` (see README).\n")
    with path.open("a") as f:
        f.write(section)
    print(json.dumps(figures), flush=True)
    return figures


def run_together(worker: Callable[[int], None], n: int) -> float:
    """Run ``worker(i)`` for i in 0..n-1 in ``n`` threads that start at the same moment; wall seconds taken.

    The clock starts once every thread is ready (thread start-up is not part of the figure).
    """
    start = threading.Barrier(n + 1)

    def run(i: int) -> None:
        start.wait()
        worker(i)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0
