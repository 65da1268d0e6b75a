"""`bench rollouts --quick` on the tiny model: the job's torch sampler and the serving engine's, on the same rows."""
from __future__ import annotations

import argparse
import json

import pytest

from bench import rollouts

pytestmark = pytest.mark.slow  # starts the serving engine (a GGUF conversion of the tiny model)


def test_rollouts_bench_quick(app_config, tmp_path, capsys):
    path = tmp_path / "BENCHMARKS.md"
    args = argparse.Namespace(quick=True, prompts=0, samples=0, max_new_tokens=0, threads=1)
    figures = rollouts.run(app_config, args, path=path)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == figures
    assert figures["engine"] == "llama_cpp" and figures["replies"] == 8
    assert figures["torch_tokens_per_s"] > 0 and figures["served_tokens_per_s"] > 0
    assert "## rollouts" in path.read_text()
