"""Which engine serves here, proved rather than assumed.

``serving.engine: auto`` means "works here": the backends of the registry (``rlhf.registry.ENGINES``)
that try this device, in its order, each offering its specs (``rlhf.serving.<backend>.spec``). On CPU that is
llama.cpp as built, llama.cpp with the safe load (no repacking into extra buffer types such as AMX, whose kernels
fault on some virtual machines), then transformers; on CUDA transformers alone. An explicit engine offers its own
specs alone (both llama.cpp loads) and stops start-up with the reasons when none runs. Under ``auto``, an
engine that cannot even be tried here (llama-cpp-python missing, a base it cannot get) stays in the list with its
reason (``EngineSpec.unavailable``), so the status and the log say why it does not serve. Each candidate is
proved by its own process (``rlhf.serving.process``); the verdict is kept per library build and CPU in
``<data_dir>/serving/verdicts.json``, so a CPU that faults once is not asked again (delete the file to ask again).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from rlhf.serving.interface import ENGINES, EngineUnavailable, spec_module
from rlhf.serving.process import EngineSpec


MAX_FAULT_CHARS = 300  # a recorded fault is one line naming a signal or an error


def cpu_fingerprint() -> str:
    """This CPU as the kernel describes it (vendor, model, feature flags) plus the machine type, hashed: a
    virtual machine on another host, or with other flags, is another CPU."""
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    break  # the first processor is enough
                key, _, value = line.partition(":")
                if key.strip() in ("vendor_id", "model name", "flags", "Features", "CPU implementer", "CPU part"):
                    fields[key.strip()] = " ".join(sorted(value.split())) if key.strip() in ("flags", "Features") \
                        else value.strip()
    except OSError:  # not Linux
        fields["processor"] = platform.processor()
    fields["machine"] = platform.machine()
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def cpu_name() -> str:
    """The CPU's model name, for people."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class Verdicts:
    """What each engine did on this CPU with this build: ``fault(spec)`` is the recorded fault (None: none
    recorded, or it worked), ``record(spec, fault)`` keeps a new verdict. One JSON file, replaced atomically."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    @staticmethod
    def key(spec: EngineSpec) -> str:
        return f"{spec.label}|{spec.build or spec.name}|{cpu_fingerprint()}"

    def read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def fault(self, spec: EngineSpec) -> Optional[str]:
        """The fault recorded for ``spec`` as one line of plain printable text (at most ``MAX_FAULT_CHARS``), or
        None. The file is data anyone with the data dir may have written: its text is cleaned before it is shown."""
        entry = self.read().get(self.key(spec))
        fault = entry.get("fault") if isinstance(entry, dict) else None
        if not fault:
            return None
        text = " ".join("".join(c if c.isprintable() else " " for c in str(fault)).split())
        return text[:MAX_FAULT_CHARS] or "a fault"

    def record(self, spec: EngineSpec, fault: Optional[str]) -> None:
        with self._lock:
            data = self.read()
            data[self.key(spec)] = {"engine": spec.label, "fault": fault, "cpu": cpu_name(),
                                    "when": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=".verdicts-", dir=self.path.parent)
                with os.fdopen(fd, "w") as fh:
                    json.dump(data, fh, indent=1, sort_keys=True)
                os.replace(tmp, self.path)
            except OSError:  # a read-only data dir: the verdict is only lost, serving goes on
                pass


def engine_specs(config, device: str) -> tuple[list[EngineSpec], str]:
    """The engines to try for this config on ``device``, in order, and the tokenizer the app builds prompts
    with: ``serving.engine`` alone, or under ``auto`` every backend of the registry that tries ``device``, in its
    order (one that cannot run here stays in the list with its reason). EngineUnavailable when an explicit
    ``serving.engine`` cannot run here; ValueError for a name the registry does not know."""
    engine = config.serving.engine
    names = [n for n, b in ENGINES.items() if b.auto_devices is None or device in b.auto_devices] \
        if engine == "auto" else [engine]
    specs: list[EngineSpec] = []
    tokenizer_source = None
    for name in names:
        found = backend_specs(name, config.base_model, device, str(config.data_path), tokenizer_source,
                              required=engine != "auto", **spec_module(name).options(config))
        tokenizer_source = tokenizer_source or next((s.settings.get("tokenizer_source") for s in found
                                                     if not s.unavailable), None)
        specs += found
    if tokenizer_source is None:
        from rlhf.base_models import resolve_model

        tokenizer_source = resolve_model(config.base_model, config.data_path)
    return specs, tokenizer_source


def backend_specs(name: str, source: str, device: str, data_dir: Optional[str],
                  tokenizer_source: Optional[str] = None, *, required: bool = False, **options) -> list[EngineSpec]:
    """Backend ``name``'s specs for base ``source`` (its ``specs``); with ``required``, EngineUnavailable with the
    reasons when none of them can run here."""
    specs = spec_module(name).specs(source, device, data_dir, tokenizer_source, **options)
    if required and all(s.unavailable for s in specs):
        reasons = "; ".join(s.unavailable for s in specs) or "it offers nothing to try"
        raise EngineUnavailable(f"serving.engine={name} cannot run here: {reasons}")
    return specs


def loop_settings(config) -> dict:
    """The engine loop's settings from the config (the same in an engine process and in the app's)."""
    s = config.serving
    return {"queue_size": s.queue_size, "max_batch_size": s.max_batch_size, "batch_window_ms": s.batch_window_ms,
            "adaptive_threads": s.adaptive_threads}
