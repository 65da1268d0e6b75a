"""The tree shows the architecture: no import cycles in rlhf/, ui/, storage/, bench/, and REST and Gradio code
meet only in ui/flows/. The graph is built from the source (ast), so it needs no imports and covers lazy imports."""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rlhf", "ui", "storage", "bench")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


ENTRIES = ("app.py", "cli.py")  # the two front doors, beside the packages


def modules() -> dict[str, Path]:
    found = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    return {**found, **{module_name(ROOT / e): ROOT / e for e in ENTRIES}}


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
    """storage imports none of ours; rlhf never imports ui, bench or the entries (app.py, cli.py), no exception;
    ui never imports bench or the entries. Only the entries sit on top of everything."""
    g = graph()
    entries = ("app", "cli")
    for name, deps in g.items():
        if name.startswith("storage"):
            assert not [d for d in deps if d.startswith(("rlhf", "ui", "bench")) or d in entries], name
        if name.startswith("rlhf"):
            assert not [d for d in deps if d.startswith(("ui", "bench")) or d in entries], f"{name} reaches up: {deps}"
        if name.startswith("ui"):
            assert not [d for d in deps if d.startswith("bench") or d in entries], f"{name} imports {deps}"


def test_the_retrain_is_its_own_package():
    """rlhf/jobs/ is the machinery (scheduler, runner, worker, context, kinds); the retrain's steps live in
    rlhf/retrain/ and use the machinery only through the job context."""
    g = graph()
    domain = ("pipeline", "evaluation", "gate", "guard", "publish", "lineage", "decisions")
    assert not [m for m in g if m.startswith("rlhf.jobs.") and m.rpartition(".")[2] in domain]
    for name, deps in g.items():
        if name.startswith("rlhf.retrain"):
            assert not [d for d in deps if d.startswith("rlhf.jobs") and d != "rlhf.jobs.context"], name


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
