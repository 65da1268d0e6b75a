"""The llama.cpp library as a wheel lays it out: ``lib/`` holds ``libggml.so``, ``.so.0`` and ``.so.0.x`` as three
separate files (a wheel has no symlinks) and ``libllama.so`` links ``libggml.so.0``. CPU variants registered through
any other copy land in a ggml llama.cpp never uses ("no backends are loaded"), so the loader opens the one libllama
links, read from its ELF ``DT_NEEDED`` entries (``rlhf.serving.llama_cpp.lib``)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf.serving.llama_cpp.spec import llama_cpp_installed
from rlhf.serving.llama_cpp.lib import cpu_backend, ggml_library, needed_libs
from tests.conftest import ROOT


def build_so(cc: str, target: Path, soname: str, links: Path | None = None) -> Path:
    """A small shared library named ``soname`` (linked against ``links`` when given)."""
    source = target.with_suffix(".c")
    source.write_text("int answer(void) { return 42; }\n")
    args = [cc, "-shared", "-fPIC", "-o", str(target), str(source), f"-Wl,-soname,{soname}"]
    if links is not None:
        args += ["-Wl,--no-as-needed", f"-L{links.parent}", f"-l:{links.name}"]
    subprocess.run(args, check=True, capture_output=True)
    return target


@pytest.mark.parametrize("soname", ["libggml.so.0", "libggml.so.1"])
def test_the_loader_opens_the_ggml_libllama_links_in_a_layout_without_symlinks(tmp_path, soname):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a stand-in libllama/libggml")
    (tmp_path / "build").mkdir()
    built = build_so(cc, tmp_path / "build" / "libggml.so", soname)
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("libggml.so", "libggml.so.0", "libggml.so.1", "libggml.so.0.25.3"):  # copies, as in a wheel
        shutil.copyfile(built, lib / name)
    build_so(cc, lib / "libllama.so", "libllama.so.0", links=built)
    assert soname in needed_libs(lib / "libllama.so")
    assert not any(p.is_symlink() for p in lib.iterdir())
    assert ggml_library(lib) == lib / soname  # the one libllama links, not the plain libggml.so


def test_without_a_readable_libllama_the_versioned_ggml_comes_first(tmp_path):
    for name in ("libggml.so", "libggml.so.0"):
        (tmp_path / name).write_bytes(b"not an ELF file")
    (tmp_path / "libllama.so").write_bytes(b"not an ELF file")
    assert needed_libs(tmp_path / "libllama.so") == []
    assert ggml_library(tmp_path) == tmp_path / "libggml.so.0"


def test_the_cpu_backend_is_read_from_the_process_mappings(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f0000 r-xp 0 08:01 1 /site/llama_cpp/lib/libggml-cpu-zen4.so\n")
    assert cpu_backend(maps) == "CPU variant zen4 (portable build)"
    maps.write_text("7f0000 r-xp 0 08:01 1 /site/llama_cpp/lib/libggml-cpu.so.0.25.3\n")
    assert cpu_backend(maps) == "native build"
    assert cpu_backend(tmp_path / "missing") == "CPU backend unknown"


LOAD = """
import json, sys
import llama_cpp
from rlhf.serving.llama_cpp import lib
model = lib.Model(sys.argv[1], extra_buffers=False)
ctx, batch = lib.Context(model, 128, 1, 32, 1), lib.Batch(model.lib, 32)
for i, token in enumerate([1, 2, 3]):
    batch.add(token, i, 0, i == 2)
print(json.dumps({"package": llama_cpp.__file__, "decode": ctx.decode(batch), "backend": lib.CPU_BACKEND,
                  "finite": bool(abs(float(ctx.logits(2).sum())) < float("inf"))}))
"""


@pytest.mark.slow  # loads llama.cpp in a fresh process
@pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed (`make setup` builds it)")
def test_a_copy_of_the_installed_library_without_symlinks_loads_a_model(tmp_path, tiny_model_dir):
    import importlib.util

    from rlhf.serving.llama_cpp.convert import hf_to_gguf
    from rlhf.serving.llama_cpp.lib import cpu_variants

    installed = Path(importlib.util.find_spec("llama_cpp").origin).parent
    site = tmp_path / "site"
    shutil.copytree(installed, site / "llama_cpp", symlinks=False)  # every link becomes a plain copy
    lib = site / "llama_cpp" / "lib"
    assert not any(p.is_symlink() for p in lib.iterdir())
    gguf = hf_to_gguf(tiny_model_dir, tmp_path / "tiny.gguf", weight_type="f32")
    run = subprocess.run([sys.executable, "-c", LOAD, str(gguf)], capture_output=True, text=True, cwd=ROOT,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{site}:{ROOT}", "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["package"].startswith(str(site))  # the copy was loaded, not the installed package
    assert out["decode"] == 0 and out["finite"]
    if cpu_variants(lib):  # a portable build: its best variant, registered in the ggml libllama links
        assert out["backend"].startswith("CPU variant ")
    else:
        assert out["backend"] == "native build"
