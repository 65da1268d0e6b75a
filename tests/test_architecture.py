"""The tree shows the architecture: no import cycles in rlhf/, ui/, storage/, bench/, no two packages in rlhf/ or ui/
that import each other, and REST and Gradio code meet only in ui/flows/. The graph is built from the source (ast), so
it needs no imports and covers lazy imports."""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rlhf", "ui", "storage", "bench")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


ENTRIES = ("app.py", "cli")  # the two front doors, beside the packages: app.py and the cli/ package


def modules() -> dict[str, Path]:
    found = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    entries = [p for e in ENTRIES for p in ((ROOT / e).rglob("*.py") if (ROOT / e).is_dir() else [ROOT / e])]
    return {**found, **{module_name(p): p for p in entries}}


def is_entry(name: str) -> bool:
    """Whether ``name`` is a front door: app.py, or the cli package or one of its modules."""
    return name == "app" or name == "cli" or name.startswith("cli.")


def resolve(target: str, known: dict) -> str | None:
    """The longest known module that ``target`` names (``a.b.C`` -> ``a.b``)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def imports_of(name: str, path: Path, known: dict) -> set[str]:
    """Modules of our packages that ``name`` imports, at top level or inside functions."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                base = ".".join(up[:len(up) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            hit = resolve(t, known)
            if hit and hit != name and not name.startswith(hit + "."):  # a package's own __init__ is no edge
                found.add(hit)
    return found


@lru_cache(maxsize=1)  # the tree does not change during a run; each test only reads the graph
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules, or None (iterative DFS with colours)."""
    colour = dict.fromkeys(g, 0)
    for start in sorted(g):
        if colour[start]:
            continue
        stack = [(start, iter(sorted(g[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(child) == 1:
                return path[path.index(child):] + [child]
            elif colour.get(child) == 0:
                colour[child] = 1
                stack.append((child, iter(sorted(g[child]))))
                path.append(child)
    return None


def test_the_graph_sees_the_packages():
    g = graph()
    assert "ui.webapp" in g and "rlhf.serving.policy_server" in g["ui.webapp"]
    assert "storage" in g["rlhf.retrain.data"]


def test_no_import_cycles():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def siblings(a: str, b: str) -> tuple[str, str] | None:
    """The two parts of the deepest package holding both modules that they sit in (``rlhf.serving.loop``,
    ``rlhf.config.app`` -> ``rlhf.serving``, ``rlhf.config``); None when one module's package holds the other."""
    x, y = a.split("."), b.split(".")
    k = 0
    while k < min(len(x), len(y)) and x[k] == y[k]:
        k += 1
    if k == 0 or k >= min(len(x), len(y)):
        return None
    return ".".join(x[:k + 1]), ".".join(y[:k + 1])


def mutual_imports(g: dict[str, set[str]], roots=("rlhf", "ui")) -> dict[tuple[str, str], list[str]]:
    """Sibling packages or modules under ``roots`` that import each other, at any depth and from any module inside
    them: (a, b) -> the imports each way."""
    edges: dict[tuple[str, str], list[str]] = {}
    for name, deps in g.items():
        for dep in deps:
            pair = siblings(name, dep) if name.partition(".")[0] in roots else None
            if pair:
                edges.setdefault(pair, []).append(f"{name} -> {dep}")
    return {(a, b): edges[a, b] + edges[b, a] for a, b in edges if a < b and (b, a) in edges}


def test_no_two_packages_import_each_other():
    """A package in rlhf/ or ui/ (and a module beside it) either builds on another or is built on, never both:
    ui.state holds the services both ui.services and ui.flows use; the registries' tables live in rlhf.registry,
    which the config reads without importing serving or training."""
    both_ways = mutual_imports(graph())
    assert not both_ways, "packages that import each other: " + "; ".join(
        f"{a} <-> {b} ({', '.join(sorted(how))})" for (a, b), how in sorted(both_ways.items()))


def test_the_mutual_import_check_sees_one(tmp_path):
    g = {"ui.services": {"ui.flows.slots", "ui.state.boards"}, "ui.flows.chat": {"ui.services", "ui.state"},
         "rlhf.a.x": {"rlhf.b.y.z"}, "rlhf.b.y.z": {"rlhf.a"}, "rlhf.serving": {"rlhf.serving.loop"},
         "rlhf.serving.loop": {"rlhf.serving"}, "storage.x": {"storage.y"}, "storage.y": {"storage.x"}}
    assert mutual_imports(g) == {("rlhf.a", "rlhf.b"): ["rlhf.a.x -> rlhf.b.y.z", "rlhf.b.y.z -> rlhf.a"],
                                 ("ui.flows", "ui.services"): ["ui.flows.chat -> ui.services",
                                                               "ui.services -> ui.flows.slots"]}
    assert siblings("rlhf.serving.loop", "rlhf.serving.llama_cpp.lib") == ("rlhf.serving.loop",
                                                                          "rlhf.serving.llama_cpp")
    probe = tmp_path / "probe.py"  # an import inside a function is an edge too
    probe.write_text("def f():\n    from ui.flows import chat\n    return chat\n")
    assert imports_of("ui.services", probe, {"ui.flows": 0, "ui.flows.chat": 0}) == {"ui.flows", "ui.flows.chat"}


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_rest_and_gradio_meet_only_in_flows():
    g = graph()
    for name, deps in g.items():
        for dep in deps:
            if name.startswith("ui.api"):
                assert not dep.startswith("ui.tabs") and dep != "ui.app", f"{name} imports Gradio code {dep}"
            if name.startswith("ui.tabs") or name == "ui.app":
                assert not dep.startswith("ui.api"), f"{name} imports REST code {dep}"
            if name.startswith("ui.flows"):
                assert not dep.startswith(("ui.api", "ui.tabs")), f"{name} is shared code but imports {dep}"


def test_layers_point_one_way():
    """storage imports none of ours; rlhf never imports ui, bench or the entries (app.py, cli/), no exception;
    ui never imports bench or the entries. Only the entries sit on top of everything."""
    g = graph()
    assert "cli.train" in g and "rlhf.training.ppo.run" in g["cli.train"]
    for name, deps in g.items():
        if name.startswith("storage"):
            assert not [d for d in deps if d.startswith(("rlhf", "ui", "bench")) or is_entry(d)], name
        if name.startswith("rlhf"):
            assert not [d for d in deps if d.startswith(("ui", "bench")) or is_entry(d)], f"{name} reaches up: {deps}"
        if name.startswith("ui"):
            assert not [d for d in deps if d.startswith("bench") or is_entry(d)], f"{name} imports {deps}"


def command_line_calls(path: Path) -> list[str]:
    """Where a module does a command line's work: imports argparse or tqdm, calls print() or sys.exit()."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"line {node.lineno}: import {n}" for n in names if n.split(".")[0] in ("argparse", "tqdm")]
        elif isinstance(node, ast.Call) and (
                (isinstance(node.func, ast.Name) and node.func.id == "print") or
                (isinstance(node.func, ast.Attribute) and node.func.attr == "exit" and
                 isinstance(node.func.value, ast.Name) and node.func.value.id == "sys")):
            found.append(f"line {node.lineno}: {ast.unparse(node.func)}()")
    return found


# process entry points the app spawns (``python -m``): they exit with their child's code
PROCESS_MAINS = ("rlhf.jobs.worker", "rlhf.serving.child")


def test_the_core_returns_results_and_never_prints():
    """Command bodies (flags, progress bars, printing, exit codes) live in cli/, one module per command; rlhf/ and
    storage/ take arguments and return results, reporting progress through callbacks."""
    g, known = graph(), modules()
    for name in g:
        if name.startswith(("rlhf", "storage")):
            calls = [c for c in command_line_calls(known[name]) if not (name in PROCESS_MAINS and "sys.exit" in c)]
            assert not calls, f"{name} does a command line's work: {calls}"


def test_the_command_line_check_sees_one(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import argparse\nfrom tqdm import tqdm\nimport sys\n\n"
                     "def f():\n    print('x')\n    sys.exit(2)\n")
    assert command_line_calls(probe) == ["line 1: import argparse", "line 2: import tqdm", "line 6: print()",
                                         "line 7: sys.exit()"]


def test_the_retrain_is_its_own_package():
    """rlhf/jobs/ is the machinery (scheduler, runner, worker, context, kinds); the retrain's steps live in
    rlhf/retrain/ and use the machinery only through the job context."""
    g = graph()
    domain = ("pipeline", "evaluation", "gate", "guard", "publish", "lineage", "decisions")
    assert not [m for m in g if m.startswith("rlhf.jobs.") and m.rpartition(".")[2] in domain]
    for name, deps in g.items():
        if name.startswith("rlhf.retrain"):
            assert not [d for d in deps if d.startswith("rlhf.jobs") and d != "rlhf.jobs.context"], name


def test_the_jobs_machinery_never_imports_the_retrain():
    """rlhf/jobs/ times and runs jobs of any kind: the retrain's trigger rules and decision settling live in
    rlhf/retrain/ and the app's composition root registers them as the scheduler's timers; job kinds are import
    paths in tables (rlhf.registry), loaded when a job runs."""
    g = graph()
    assert [m for m in g if m.startswith("rlhf.jobs.")]
    for name, deps in g.items():
        if name.startswith("rlhf.jobs"):
            assert not [d for d in deps if d.startswith("rlhf.retrain")], f"{name} imports {deps}"


def test_registries_are_light_tables():
    """Engines, retrain methods, reward-model kinds and job kinds: name -> "module:attr" in rlhf.registry, which
    imports none of what it names; the config check reads them there, and each seam's own module (methods, reward
    kinds) takes its table from it and imports nothing else of ours."""
    g = graph()
    assert not [d for d in g["rlhf.registry"] if d.startswith("rlhf")], f"rlhf.registry imports {g['rlhf.registry']}"
    for table in ("rlhf.training.methods", "rlhf.training.reward_kinds"):
        assert g[table] <= {"rlhf.registry"}, f"{table} imports {g[table]}"
    for name, deps in g.items():
        if name.startswith("rlhf.config"):
            assert not [d for d in deps if d.startswith(("rlhf.serving", "rlhf.training"))], f"{name} imports {deps}"


def test_interop_builds_on_the_retrain_not_the_reverse():
    """Importing a policy publishes it through the retrain's publish step; publishing writes the model card the
    Hub push also writes: rlhf.interop imports rlhf.retrain, never the reverse (no back-and-forth)."""
    g = graph()
    assert "rlhf.retrain.publish" in g["rlhf.interop.import_policy"]
    for name, deps in g.items():
        if name.startswith("rlhf.retrain"):
            assert not [d for d in deps if d.startswith("rlhf.interop")], f"{name} imports {deps}"


def test_benchmarks_are_not_in_the_runtime_package():
    assert not (ROOT / "rlhf" / "bench").exists()
    assert "bench.serve" in graph() and not [m for m in graph() if m.startswith("rlhf.bench")]


ENGINE_INTERNALS = ("rlhf.serving.transformers", "rlhf.serving.llama_cpp", "rlhf.serving.loop",
                    "rlhf.serving.process", "rlhf.serving.child", "rlhf.serving.spawn", "rlhf.serving.wire")


def engine_reach(path: Path) -> list[str]:
    """Where a module reaches into a serving engine: ``x.engine_load()``, ``x.engine.<anything>`` or ``x.engine`` on
    something other than the ``serving`` config section (``cfg.serving.engine`` names the engine setting)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        setting = isinstance(node.value, ast.Attribute) and node.value.attr == "serving"
        if node.attr == "engine_load" or (node.attr == "engine" and not setting):
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


def test_nothing_outside_serving_touches_engine_internals():
    """Outside rlhf/serving, code asks the PolicyServer (idle, requests_seen, others, stream, ...) and the seam in
    rlhf.serving.interface; it never imports an engine module nor reads a server's engine."""
    g, known = graph(), modules()
    for name, deps in g.items():
        if name.startswith("rlhf.serving") or not name.startswith(("rlhf", "ui")):
            continue
        assert not [d for d in deps if d.startswith(ENGINE_INTERNALS)], f"{name} imports an engine module"
        if name.startswith("rlhf.config"):  # defines the serving.engine setting itself (self.engine)
            continue
        assert not engine_reach(known[name]), f"{name} reads engine internals: {engine_reach(known[name])}"


def test_the_engine_check_sees_a_reach(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(server, cfg):\n    return server.engine.threads, server.engine_load(), cfg.serving.engine\n")
    assert engine_reach(probe) == ["line 2: .engine", "line 2: .engine_load"]


def defines_middleware(path: Path) -> list[str]:
    """Where a module defines or installs middleware: a class with an ASGI ``__call__(self, scope, receive, send)``,
    a ``dispatch`` (Starlette's BaseHTTPMiddleware) or an ``add_middleware`` / ``@app.middleware`` call."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                node.name == "dispatch" or (node.name == "__call__" and [a.arg for a in node.args.args[1:4]] ==
                                            ["scope", "receive", "send"])):
            found.append(f"line {node.lineno}: {node.name}")
        if isinstance(node, ast.Attribute) and node.attr in ("add_middleware", "middleware"):
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


def test_no_grab_bags_in_ui():
    """ui/ is split by page and by concern: no views.py or core.py module collects unrelated functions (views live in
    ui/views/<page>.py, REST routes in ui/api/<concern>.py); REST routers define routes only (middleware is
    ui/api/middleware.py's, error handlers ui/api/errors.py's)."""
    g, known = graph(), modules()
    assert not [m for m in g if m.startswith("ui.") and m.rpartition(".")[2] in ("views", "core") and
                not (ROOT / m.replace(".", "/")).is_dir()]
    for name in g:
        if name.startswith("ui.api.") and name not in ("ui.api.middleware", "ui.api.errors"):
            assert not defines_middleware(known[name]), f"{name} defines middleware: {defines_middleware(known[name])}"
            assert "exception_handler" not in known[name].read_text(), f"{name} installs an error handler"


def test_the_middleware_check_sees_one(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("class M:\n    async def __call__(self, scope, receive, send):\n        pass\n\n"
                     "def f(app):\n    app.add_middleware(M)\n")
    assert defines_middleware(probe) == ["line 2: __call__", "line 6: .add_middleware"]
