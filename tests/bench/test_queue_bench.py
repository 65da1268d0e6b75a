"""`bench queue --quick` on the tiny model: chat TTFT with the refill off and on, vote→next latency, the report."""
from __future__ import annotations

import argparse
import json

import pytest

from bench import queue as bench_queue

pytestmark = pytest.mark.slow  # a live server and the refill thread for half a minute


def test_queue_bench_quick(app_config, tmp_path, capsys):
    path = tmp_path / "BENCHMARKS.md"
    figures = bench_queue.run(app_config, argparse.Namespace(quick=True), path=path)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == figures
    assert 0 < figures["ttft_alone_p50_s"] <= figures["ttft_alone_p95_s"]
    assert 0 < figures["ttft_refill_p50_s"] <= figures["ttft_refill_p95_s"]
    assert figures["refill_items"] > 0  # it did generate between the chats
    assert 0 < figures["next_after_vote_p50_ms"] <= figures["next_after_vote_p95_ms"]
    assert "## bench queue" in path.read_text()
