"""A thin layer over llama.cpp's C API (through llama-cpp-python's ctypes bindings): one model, contexts on it,
LoRA adapters, and a reusable multi-sequence batch. No scheduling here: ``rlhf.serving.llama_cpp.engine`` does it.

Every call into the library releases the GIL (ctypes does). Native code can fault on a user's CPU, so this module
is only imported in the engine's own process (``rlhf.serving.child``), never in the app's.
"""
from __future__ import annotations

import ctypes
import logging
import re
import struct
import threading
from pathlib import Path
from typing import Optional

import numpy as np

from rlhf.serving.interface import EngineUnavailable

log = logging.getLogger(__name__)
_init_lock = threading.Lock()
_initialised = False
CPU_BACKEND = ""  # which CPU kernels llama.cpp runs on here (``cpu_backend``), once the library is initialised


def library():
    """The ``llama_cpp`` bindings, initialised once (backend up, C logs only on errors)."""
    global _initialised, CPU_BACKEND
    try:
        import llama_cpp
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise EngineUnavailable("llama-cpp-python is not installed (`make setup` builds it)") from exc
    with _init_lock:
        if not _initialised:
            logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # its C log callback reads this level
            lib_dir = llama_lib_dir(llama_cpp)
            load_cpu_variants(lib_dir)
            llama_cpp.llama_backend_init()
            CPU_BACKEND = cpu_backend()
            log.info("llama.cpp runs on %s (%s)", CPU_BACKEND, lib_dir)
            _initialised = True
    return llama_cpp


def llama_lib_dir(llama_cpp) -> Path:
    """The folder libllama was loaded from (llama-cpp-python's ``lib/``, or its ``LLAMA_CPP_LIB_PATH``)."""
    loaded = getattr(getattr(getattr(llama_cpp, "llama_cpp", None), "_lib", None), "_name", None)
    return Path(loaded).parent if loaded else Path(llama_cpp.__file__).parent / "lib"


def cpu_variants(lib_dir: Path) -> list[Path]:
    """The CPU backend variants of a portable build (``GGML_BACKEND_DL`` + ``GGML_CPU_ALL_VARIANTS``: one
    ``libggml-cpu-<cpu>.so`` per x86 level); empty for a build made for one CPU (``GGML_NATIVE``)."""
    return sorted(lib_dir.glob("libggml-cpu-*.so"))


def needed_libs(elf: Path) -> list[str]:
    """The libraries a 64-bit little-endian ELF file links (its ``DT_NEEDED`` sonames, from ``.dynamic``); empty
    when the file is not one."""
    try:
        data = Path(elf).read_bytes()
    except OSError:
        return []
    if data[:6] != b"\x7fELF\x02\x01":
        return []
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    for _, sh_type, _, _, offset, size, link, _, _, _ in sections:
        if sh_type != 6:  # SHT_DYNAMIC; its sh_link is the string table of its names
            continue
        strings = sections[link][4]
        names = []
        for pos in range(offset, offset + size, 16):
            tag, value = struct.unpack_from("<qQ", data, pos)
            if tag == 0:  # DT_NULL
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", strings + value)
                names.append(data[strings + value:end].decode())
        return names
    return []


def ggml_library(lib_dir: Path) -> Path:
    """The ggml file llama.cpp uses: the one ``libllama.so`` links (``libggml.so.0``), else ``libggml.so.0`` or
    ``libggml.so``. A wheel cannot hold symlinks, so ``lib/`` has ``libggml.so``, ``.so.0`` and ``.so.0.x`` as three
    separate copies: backends registered through any other copy land in a ggml nobody uses, and every model load
    then fails with "no backends are loaded"."""
    linked = [n for n in needed_libs(lib_dir / "libllama.so") if re.fullmatch(r"libggml\.so(\.\d+)*", n)]
    for name in [*linked, "libggml.so.0", "libggml.so"]:
        if (lib_dir / name).is_file():
            return lib_dir / name
    raise EngineUnavailable(f"llama.cpp's ggml library is not in {lib_dir}")


def load_cpu_variants(lib_dir: Path) -> None:
    """Let a portable build pick the best kernels for this CPU at run time. ggml looks for its backends beside
    the executable and in the working directory, which for Python is neither, so point it at the package's
    ``lib/``: it scores every variant against this CPU and loads the best one, into the ggml libllama links."""
    if not cpu_variants(lib_dir):
        return
    ggml = ctypes.CDLL(str(ggml_library(lib_dir)))
    ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_load_all_from_path(str(lib_dir).encode())
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    if ggml.ggml_backend_dev_count() == 0:
        raise EngineUnavailable(f"none of llama.cpp's CPU variants in {lib_dir} loads on this CPU "
                                f"({', '.join(p.name for p in cpu_variants(lib_dir))})")


def cpu_backend(maps: str | Path = "/proc/self/maps") -> str:
    """Which CPU kernels this process loaded, for people: ``CPU variant zen4 (portable build)``, ``native build``
    for a build made for one CPU, ``CPU backend unknown`` where the process's mappings cannot be read."""
    try:
        text = Path(maps).read_text()
    except OSError:
        return "CPU backend unknown"
    variants = sorted(set(re.findall(r"libggml-cpu-([\w.-]+?)\.so", text)))
    if variants:
        return f"CPU variant {', '.join(variants)} (portable build)"
    return "native build" if re.search(r"libggml-cpu\.so", text) else "CPU backend unknown"


class Model:
    """A GGUF model loaded once (memory-mapped); contexts and adapters share its weights.

    ``extra_buffers=False`` keeps the weights as they are in the file: llama.cpp otherwise repacks them into its
    extra buffer types at load (AMX tiles on Sapphire/Granite Rapids, CPU repacks), whose kernels fault on some
    virtual machines."""

    def __init__(self, path: str | Path, extra_buffers: bool = False):
        self.lib = lib = library()
        self.path = str(path)
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = bool(extra_buffers)
        self.ptr = lib.llama_model_load_from_file(self.path.encode(), params)
        if not self.ptr:
            raise EngineUnavailable(f"llama.cpp cannot load {self.path}")
        self.vocab = lib.llama_model_get_vocab(self.ptr)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.eos = int(lib.llama_vocab_eos(self.vocab))

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """llama.cpp's own token ids for ``text`` (with the GGUF's pre-tokenizer; special tokens in the text are
        matched when ``parse_special``)."""
        data = text.encode("utf-8")
        size = len(data) + 8
        for _ in range(2):
            buf = (self.lib.llama_token * size)()
            n = self.lib.llama_tokenize(self.vocab, data, len(data), buf, size, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            size = -n  # too small: llama.cpp says how many it needs
        raise RuntimeError(f"llama.cpp could not tokenize a text of {len(data)} bytes")

    def close(self) -> None:
        if self.ptr:
            self.lib.llama_model_free(self.ptr)
            self.ptr = None


class Lora:
    """A GGUF LoRA adapter loaded onto ``model`` (its tensors only; the base is not copied)."""

    def __init__(self, model: Model, path: str | Path):
        self.lib, self.path = model.lib, str(path)
        self.ptr = model.lib.llama_adapter_lora_init(model.ptr, self.path.encode())
        if not self.ptr:
            raise ValueError(f"llama.cpp refused the LoRA file {self.path}")

    def close(self) -> None:
        if self.ptr:
            self.lib.llama_adapter_lora_free(self.ptr)
            self.ptr = None


class Context:
    """One llama.cpp context: its own KV cache (unified: sequences share cells, so a copied prefix costs no memory),
    up to ``n_seq`` sequences, and the LoRA set that applies to everything it decodes."""

    def __init__(self, model: Model, n_ctx: int, n_seq: int, n_batch: int, threads: int):
        lib = self.lib = model.lib
        self.model = model
        params = lib.llama_context_default_params()
        params.n_ctx = int(n_ctx)
        params.n_batch = params.n_ubatch = int(n_batch)
        params.n_seq_max = int(n_seq)
        params.n_threads = params.n_threads_batch = int(threads)
        params.kv_unified = True
        params.no_perf = True
        params.embeddings = False
        self.ptr = lib.llama_init_from_model(model.ptr, params)
        if not self.ptr:
            raise RuntimeError(f"llama.cpp could not create a context of {n_ctx} tokens x {n_seq} sequences")
        self.memory = lib.llama_get_memory(self.ptr)
        self.n_ctx, self.n_seq, self.n_batch, self.threads = int(n_ctx), int(n_seq), int(n_batch), int(threads)
        self.lora: Optional[Lora] = None

    def set_threads(self, threads: int) -> None:
        if threads != self.threads:
            self.lib.llama_set_n_threads(self.ptr, int(threads), int(threads))
            self.threads = int(threads)

    def set_lora(self, lora: Optional[Lora]) -> None:
        """Decode with ``lora`` (None = the base) from now on."""
        if lora is None:
            self.lib.llama_set_adapters_lora(self.ptr, None, 0, None)
        else:
            adapters = (self.lib.llama_adapter_lora_p_ctypes * 1)(lora.ptr)
            scales = (ctypes.c_float * 1)(1.0)
            if self.lib.llama_set_adapters_lora(self.ptr, adapters, 1, scales) != 0:
                raise RuntimeError(f"llama.cpp could not apply {lora.path}")
        self.lora = lora

    def decode(self, batch: "Batch") -> int:
        """Run the batch; 0 on success, 1 when the KV cache has no room, < 0 on error."""
        return int(self.lib.llama_decode(self.ptr, batch.raw))

    def logits(self, i: int) -> np.ndarray:
        """The logits of the batch's ``i``-th token (it must have asked for them): a view, valid until the next
        decode on this context."""
        ptr = self.lib.llama_get_logits_ith(self.ptr, i)
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))

    def seq_rm(self, seq: int, start: int = -1, end: int = -1) -> None:
        self.lib.llama_memory_seq_rm(self.memory, seq, start, end)

    def seq_cp(self, src: int, dst: int, start: int, end: int) -> None:
        """Let ``dst`` see ``src``'s cells in [start, end): shared, not copied (unified KV cache)."""
        self.lib.llama_memory_seq_cp(self.memory, src, dst, start, end)

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.memory, True)

    def close(self) -> None:
        if self.ptr:
            self.lib.llama_free(self.ptr)
            self.ptr = None


class Batch:
    """A ``llama_batch`` allocated once and refilled every step: token, position, one sequence id, logits flag."""

    def __init__(self, lib, capacity: int):
        self.lib, self.capacity = lib, int(capacity)
        self.raw = lib.llama_batch_init(self.capacity, 0, 1)
        self.n = 0

    def clear(self) -> None:
        self.n = 0
        self.raw.n_tokens = 0

    def add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        """Append one token; returns its index in the batch (for ``Context.logits``)."""
        i = self.n
        if i >= self.capacity:  # writing past llama_batch_init's arrays would corrupt memory
            raise IndexError(f"llama batch is full ({self.capacity} tokens)")
        raw = self.raw
        raw.token[i] = token
        raw.pos[i] = pos
        raw.n_seq_id[i] = 1
        raw.seq_id[i][0] = seq
        raw.logits[i] = 1 if logits else 0
        self.n = i + 1
        raw.n_tokens = self.n
        return i

    def close(self) -> None:
        if self.raw is not None:
            self.lib.llama_batch_free(self.raw)
            self.raw = None
