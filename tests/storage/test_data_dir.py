"""One ``DataDir`` names every path in a data dir: nothing else in the production code spells them."""
from __future__ import annotations

import ast
from pathlib import Path

from storage.paths import DataDir

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("rlhf", "ui", "storage", "cli", "app.py")
HOME = ROOT / "storage" / "paths.py"
NAMES = {v for k, v in vars(DataDir).items() if k.isupper() and isinstance(v, str)}


def test_data_dir_names_each_path(tmp_path):
    d = DataDir(tmp_path)
    assert d.db == tmp_path / "studio.db" and DataDir.of_database(d.db) == d
    assert [p.name for p in d.db_files] == ["studio.db", "studio.db-wal", "studio.db-shm", "studio.db-journal"]
    assert d.agent_policies("assistant") == tmp_path / "policies" / "assistant"
    assert d.job_run(7) == tmp_path / "runs" / "job7" and d.job_log(7) == tmp_path / "jobs" / "7.log"
    assert d.model("m") == tmp_path / "models" / "m" and d.tokenizer("m") == tmp_path / "tokenizers" / "m"
    assert d.gguf == tmp_path / "gguf" and d.serving_verdicts == tmp_path / "serving" / "verdicts.json"
    assert DataDir.of_reward_model(d.reward_models / "rm-1") == d
    assert DataDir.of_reward_model(tmp_path / "elsewhere" / "rm-1") is None
    assert set(DataDir.BACKED_UP) <= set(DataDir.STORED_TREES) <= NAMES


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _is_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in NAMES


def path_literals(source: str) -> list[tuple[int, str]]:
    """(line, literal) where ``source`` spells a data-dir path: a file name (``studio.db``) anywhere but a
    docstring; a folder name joined into a path (``x / "runs"``, ``Path(x, "runs")``, ``os.path.join``) or listed
    in a tuple/list of data-dir names. A SQL table that shares a folder's name (``"policies"``) is neither."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if _is_name(node) and "." in node.value and id(node) not in docs:
            found.append(node)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            found += [n for n in (node.left, node.right) if _is_name(n)]
        elif isinstance(node, ast.Call):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if func in ("Path", "PurePath", "PurePosixPath", "joinpath", "join"):
                found += [a for a in node.args if _is_name(a)]
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(map(_is_name, node.elts)) \
                and all(_is_name(e) or isinstance(e, ast.Starred) for e in node.elts):
            found += [e for e in node.elts if _is_name(e)]
    return sorted({(n.lineno, n.value) for n in found})


def test_the_finder_finds_path_literals():
    code = ('"""Holds studio.db."""\nDB = "studio.db"\nrun = root / "runs" / "x"\nT = ("policies", "runs")\nU = (*T, "jobs")\n'
            'p = Path(root, "models")\nsql = insert(db, "policies", {})\nSECTIONS = ["serving", "reward"]\n')
    assert path_literals(code) == [(2, "studio.db"), (3, "runs"), (4, "policies"), (4, "runs"), (5, "jobs"),
                                  (6, "models")]


def test_no_data_dir_literals_outside_data_dir():
    files = [p for entry in PRODUCTION for p in ((ROOT / entry).rglob("*.py") if (ROOT / entry).is_dir()
                                                 else [ROOT / entry])]
    assert HOME in files and len(files) > 50
    spelled = {f"{p.relative_to(ROOT)}:{line}": name for p in files if p != HOME
               for line, name in path_literals(p.read_text())}
    assert not spelled, f"data-dir paths spelled outside storage/paths.py (use DataDir): {spelled}"
