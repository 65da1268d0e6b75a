"""requirements.txt (what a Hugging Face Space installs) agrees with pyproject.toml (what `make setup` installs).

Parsed with ``packaging`` as pip parses them: every dependency of the app is on the Space, no pin of one
file falls outside the other's range, the Space extras are there, and the environment these tests run in
(one resolution of pyproject.toml) satisfies requirements.txt too, checked by pip itself without an index.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from tests.conftest import ROOT


def space_lines() -> list[tuple[str, list[str]]]:
    """(requirement, its per-requirement options) of every line of requirements.txt."""
    out = []
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = re.sub(r"(^|\s+)#.*$", "", line).strip()  # pip's comment rule: a URL's #sha256= is not one
        if not line:
            continue
        assert not line.startswith("-"), f"requirements.txt: global options are not used on Spaces here: {line!r}"
        requirement, *options = line.split(" --")
        assert all(o.startswith("config-settings=") for o in options), f"requirements.txt: {line!r}"
        out.append((requirement.strip(), [o.removeprefix("config-settings=") for o in options]))
    return out


def space_requirements() -> dict[str, Requirement]:
    reqs: dict[str, Requirement] = {}
    for line, _ in space_lines():
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name not in reqs, f"requirements.txt lists {req.name} twice"
        reqs[name] = req
    return reqs


def pinned_version(req: Requirement) -> Version | None:
    """The one version a requirement allows: its ``==`` pin, or the version in a direct URL's sdist file name."""
    if req.url:
        name = req.url.split("#")[0].split("?")[0].rsplit("/", 1)[-1]
        return Version(name.removesuffix(".tar.gz").rsplit("-", 1)[1])
    pins = [s for s in req.specifier if s.operator == "=="]
    return Version(pins[0].version) if len(pins) == 1 else None


def allows(req: Requirement, have: Version) -> bool:
    """True when ``have`` satisfies ``req`` (a direct URL allows only the version its file name carries)."""
    return have == pinned_version(req) if req.url else req.specifier.contains(have, prereleases=True)


def project() -> tuple[dict[str, Requirement], dict[str, Requirement]]:
    """(runtime dependencies, optional ones from every extra) of pyproject.toml."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {canonicalize_name(Requirement(r).name): Requirement(r) for r in meta["dependencies"]}
    optional = {canonicalize_name(Requirement(r).name): Requirement(r)
                for extra in meta.get("optional-dependencies", {}).values() for r in extra}
    return runtime, optional


def can_agree(a: Requirement, b: Requirement) -> bool:
    """True when some version satisfies both specifier sets (tried on every version either one names)."""
    if not a.specifier or not b.specifier:
        return True
    candidates = set()
    for spec in [*a.specifier, *b.specifier]:
        try:
            candidates.add(Version(spec.version.rstrip(".*")))
        except InvalidVersion:
            pass
    return any(a.specifier.contains(v, prereleases=True) and b.specifier.contains(v, prereleases=True)
               for v in candidates)


def test_can_agree_by_hand():
    assert can_agree(Requirement("x==1.2"), Requirement("x>=1.0,<2"))
    assert can_agree(Requirement("x>=2.4,<=2.14.1"), Requirement("x>=2.4,<=2.14.1"))
    assert can_agree(Requirement("x"), Requirement("x==3"))
    assert not can_agree(Requirement("x==1.2"), Requirement("x==1.3"))
    assert not can_agree(Requirement("x==2.15"), Requirement("x>=2.4,<=2.14.1"))


def test_every_app_dependency_is_on_the_space_with_an_agreeing_pin():
    space, (runtime, optional) = space_requirements(), project()
    missing = sorted(set(runtime) - set(space))
    assert not missing, f"pyproject.toml needs {missing} but requirements.txt (the Space) does not install them"
    for name, req in space.items():
        declared = runtime.get(name) or optional.get(name)
        if declared is None:  # a Space-only package must be pinned: nothing else constrains it
            assert pinned_version(req) is not None, f"requirements.txt: {req} is not in pyproject.toml, so pin it exactly"
            continue
        agree = allows(declared, pinned_version(req)) if req.url else can_agree(req, declared)
        assert agree, f"requirements.txt {req} conflicts with pyproject.toml {declared}"
        assert declared.extras <= req.extras, f"requirements.txt {req} drops pyproject's extras {declared.extras}"


def test_the_space_signs_in_and_serves_on_cpu():
    space = space_requirements()
    assert "oauth" in space["gradio"].extras, "a Space needs gradio[oauth] for 'Sign in with Hugging Face'"
    assert pinned_version(space["llama-cpp-python"]) == Version("0.3.36"), "the CPU serving engine"


def test_the_portable_llama_cpp_never_reuses_a_cached_native_wheel(tmp_path):
    """pip keys its wheel cache by the sdist's URL (and hash), not by --config-settings: a native llama-cpp-python
    built from the index (``make setup``) is cached under the index URL's key. The Space's line names the same
    sdist by a URL of its own, so pip's own cache lookup finds the native wheel for the index link, and nothing for
    the Space's (it builds the portable wheel, and caches that under its own key)."""
    cache_mod = pytest.importorskip("pip._internal.cache")
    from pip._internal.models.link import Link
    from pip._internal.utils.compatibility_tags import get_supported

    req = space_requirements()["llama-cpp-python"]
    assert req.url and "#sha256=" in req.url, "the Space's llama-cpp-python line names its sdist by URL and hash"
    url, digest = req.url.split("#", 1)
    index_link = Link(url.split("?", 1)[0] + "#" + digest)  # what the index (or `make setup`) resolves to
    space_link = Link(req.url)
    assert space_link.hash == index_link.hash and space_link.filename == index_link.filename  # the same sdist
    cache = cache_mod.SimpleWheelCache(str(tmp_path))  # the persistent wheel cache (pip's `wheels/` folder)
    native = Path(cache.get_path_for_link(index_link))
    native.mkdir(parents=True)
    tags = get_supported()
    wheel = native / f"llama_cpp_python-0.3.36-{tags[0].interpreter}-{tags[0].abi}-{tags[0].platform}.whl"
    wheel.write_bytes(b"native")
    assert cache.get(index_link, "llama-cpp-python", tags).file_path == str(wheel)  # the trap, as pip sees it
    assert cache.get(space_link, "llama-cpp-python", tags) is space_link  # not cached: pip builds it, portable


def test_the_space_builds_llama_cpp_for_any_cpu_it_may_run_on():
    """A Space image is built on one machine and run on another: every CPU variant, picked at run time, installed
    where rlhf.serving.llama_cpp.lib looks for them (the package's lib/)."""
    options = dict(o.split("=", 1) for line, opts in space_lines() if line.startswith("llama-cpp-python")
                   for o in opts)
    assert options["cmake.define.GGML_NATIVE"] == "OFF" and options["cmake.define.GGML_BACKEND_DL"] == "ON"
    assert options["cmake.define.GGML_CPU_ALL_VARIANTS"] == "ON"
    assert options["cmake.define.CMAKE_INSTALL_BINDIR"] == "llama_cpp/lib"


def test_this_environment_satisfies_both_files(tmp_path):
    """The installed packages are one resolution of pyproject.toml; they must satisfy requirements.txt too.
    pip checks it (``--dry-run --no-deps --no-index``: nothing is fetched) for every package installed here."""
    space, (runtime, _) = space_requirements(), project()
    installed = []
    for name, req in space.items():
        try:
            have = Version(version(req.name))
        except PackageNotFoundError:
            assert name not in runtime, f"{req.name} is an app dependency but is not installed"
            continue  # Space-only and not built here (llama-cpp-python is a 10-minute C++ build)
        assert allows(req, have), f"installed {req.name} {have} breaks requirements.txt"
        if req.url:  # a direct URL: pip would fetch it to compare; the version in its file name was checked
            continue
        if name in runtime:
            assert runtime[name].specifier.contains(have, prereleases=True), f"installed {req.name} {have} breaks " \
                                                                             "pyproject.toml"
        installed.append(next(f"{line} {' '.join('--config-settings=' + o for o in opts)}".strip()
                              for line, opts in space_lines() if Requirement(line).name == req.name))
    listed = tmp_path / "requirements-installed.txt"  # the lines as they are, options too: pip parses them
    listed.write_text("\n".join(installed) + "\n")
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index",
                          "--disable-pip-version-check", "-r", str(listed)], capture_output=True, text=True)
    if pip.returncode != 0 and "No module named pip" in pip.stderr:
        pytest.skip("pip is not installed in this environment")
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert "Would install" not in pip.stdout, pip.stdout
