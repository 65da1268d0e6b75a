"""`rlhf-studio bench`: the checkout's bench/ package, each benchmark parsing its own flags."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import bench
from cli import main
from cli.bench import bench_parser

ROOT = Path(__file__).resolve().parents[2]


def test_each_benchmark_owns_its_flags():
    for name in bench.BENCHMARKS:
        parser = bench_parser(name, bench.benchmark(name))
        assert parser.parse_args(["--quick"]).quick is True
    serve = bench_parser("serve", bench.benchmark("serve")).parse_args(["--users", "8", "--during-retrain"])
    assert serve.users == 8 and serve.during_retrain
    with pytest.raises(SystemExit):  # a flag of another benchmark is refused, not ignored
        bench_parser("serve", bench.benchmark("serve")).parse_args(["--oracle", "concise"])


def test_bench_command_runs_the_named_benchmark_with_config_flags_on_either_side(monkeypatch):
    seen = {}
    monkeypatch.setattr(bench.benchmark("decide"), "run", lambda config, args: seen.update(config=config, args=args))
    assert main(["bench", "--set", "gate.min_judge_pairs=7", "decide", "--trials", "5", "--set", "ppo.steps=3"]) == 0
    assert seen["args"].trials == 5 and seen["args"].quick is False
    assert seen["config"].gate.min_judge_pairs == 7 and seen["config"].ppo.steps == 3


def test_bench_from_an_installed_package_says_where_the_benchmarks_are(tmp_path):
    site = tmp_path / "site-packages"  # installed from a wheel: no bench/ and no pyproject beside cli/
    for package in ("rlhf", "ui", "storage", "cli", "assets"):  # what the wheel installs
        shutil.copytree(ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-c", "import sys; from cli import main; sys.exit(main(sys.argv[1:]))",
                           "bench", "serve"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert "source checkout" in done.stderr and "Traceback" not in done.stderr


def test_bench_is_not_an_installed_package():
    text = (ROOT / "pyproject.toml").read_text()
    include = re.search(r"^\[tool\.setuptools\.packages\.find\]\n(?:#.*\n)*include = \[([^\]]*)\]", text, re.M).group(1)
    names = [p.strip().strip('"') for p in include.split(",")]
    assert "rlhf*" in names and not [p for p in names if p.startswith("bench")]


def test_a_flag_can_run_a_sibling_module():
    serve = bench.benchmark("serve")
    args = bench_parser("serve", serve).parse_args(["--during-retrain"])
    assert bench.runner("serve", args).__name__ == "bench.serve_retrain"
    args = bench_parser("reward", bench.benchmark("reward")).parse_args(["--active"])
    assert bench.runner("reward", args).__name__ == "bench.reward_active"
    assert bench.runner("serve", bench_parser("serve", serve).parse_args([])) is serve
