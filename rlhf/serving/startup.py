"""Which engine serves here, proved rather than assumed.

``serving.engine: auto`` means "works here": on CPU with llama.cpp installed, the candidates are llama.cpp as
built, llama.cpp with the safe load (no repacking into extra buffer types such as AMX, whose kernels fault on some
virtual machines), then transformers; on CUDA, or without llama.cpp, transformers alone. An explicit
``llama_cpp`` tries both llama.cpp loads and stops start-up with the reasons when neither runs. Under ``auto``, an
engine that cannot even be tried here (llama-cpp-python missing, a base it cannot get) stays in the list with its
reason (``EngineSpec.unavailable``), so the status and the log say why it does not serve. Each candidate is
proved by its own process (``rlhf.serving.process``); the verdict is kept per library build and CPU in
``<data_dir>/serving/verdicts.json``, so a CPU that faults once is not asked again (delete the file to ask again).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import tempfile
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from rlhf.serving.interface import ENGINE_CHOICES, EngineUnavailable, llama_cpp_installed
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


def llama_build() -> str:
    """This llama-cpp-python build (version and its native libraries' sizes and times), hashed; found on disk,
    never imported here."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.origin:
        return "none"
    lib = Path(spec.origin).parent / "lib"
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in lib.glob("*.so*") if p.is_file())
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return hashlib.sha256(json.dumps([version, str(lib), files]).encode()).hexdigest()[:16]


class Verdicts:
    """What each engine did on this CPU with this build: ``fault(spec)`` is the recorded fault (None: none
    recorded, or it worked), ``record(spec, fault)`` keeps a new verdict. One JSON file, replaced atomically."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    @staticmethod
    def key(spec: EngineSpec) -> str:
        build = llama_build() if spec.name == "llama_cpp" else spec.name
        return f"{spec.label}|{build}|{cpu_fingerprint()}"

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
    with. EngineUnavailable when an explicit ``serving.engine`` cannot run at all."""
    s = config.serving
    if s.engine not in ENGINE_CHOICES:
        raise ValueError(f"serving.engine must be one of {', '.join(ENGINE_CHOICES)}, got {s.engine!r}")
    specs: list[EngineSpec] = []
    tokenizer_source = None
    want_llama = s.engine == "llama_cpp" or (s.engine == "auto" and device == "cpu")
    if want_llama:
        try:
            gguf, tokenizer_source = llama_files(config)
        except (EngineUnavailable, OSError) as exc:  # OSError: e.g. no room in the data dir for a converted base
            if s.engine == "llama_cpp":
                raise EngineUnavailable(f"serving.engine=llama_cpp cannot run here: {exc}") from exc
            specs.append(EngineSpec("llama_cpp", {}, "llama.cpp", unavailable=str(exc)))  # passed over, with why
        else:
            settings = {"gguf": str(gguf), "tokenizer_source": tokenizer_source, **llama_options(config)}
            specs.append(EngineSpec("llama_cpp", {**settings, "extra_buffers": True}, "llama.cpp"))
            specs.append(EngineSpec("llama_cpp", {**settings, "extra_buffers": False},
                                    "llama.cpp, safe load (weights not repacked for AMX)"))
    if s.engine != "llama_cpp":
        specs.append(EngineSpec("transformers", {
            "model_source": config.base_model, "data_dir": str(config.data_path), "device": device,
            "tokenizer_source": tokenizer_source, "load_in_4bit": s.load_in_4bit,
            "max_batch_size": s.max_batch_size}, "transformers" if device == "cpu" else f"transformers ({device})"))
    if tokenizer_source is None:
        from rlhf.base_models import resolve_model

        tokenizer_source = resolve_model(config.base_model, config.data_path)
    return specs, tokenizer_source


def llama_files(config) -> tuple[Path, str]:
    """(GGUF file, tokenizer source) llama.cpp serves for the config's base model; EngineUnavailable when
    llama-cpp-python is missing or the model cannot be served by it."""
    from rlhf.serving.llama_cpp.base import llama_base

    if not llama_cpp_installed():
        raise EngineUnavailable("llama-cpp-python is not installed (`make setup` builds it)")
    return llama_base(config.base_model, str(config.data_path), config.serving.llama_weights)


def llama_options(config) -> dict:
    """The llama.cpp engine's settings from the config."""
    s = config.serving
    return {"kv_cache_tokens": max(s.kv_cache_tokens, s.max_context_tokens + 64), "max_contexts": s.llama_contexts,
            "max_batch_size": s.max_batch_size, "cache_dir": str(config.data_path)}


def loop_settings(config) -> dict:
    """The engine loop's settings from the config (the same in an engine process and in the app's)."""
    s = config.serving
    return {"queue_size": s.queue_size, "max_batch_size": s.max_batch_size, "batch_window_ms": s.batch_window_ms,
            "adaptive_threads": s.adaptive_threads}
