"""Quick runs of the serve, ingest and memory benchmarks on the tiny model: a table, a BENCHMARKS.md section
(written to a temp file), and one JSON line printed last with the contracted figures."""
from __future__ import annotations

import pytest

import argparse
import json

from bench import ingest as bench_ingest, memory as bench_memory, serve as bench_serve
from rlhf.serving.llama_cpp.spec import llama_cpp_installed

pytestmark = pytest.mark.slow  # trains or starts processes: not in `make test-fast`


def quick(**extra):
    return argparse.Namespace(users=None, quick=True, **extra)


def last_json_line(capsys) -> dict:
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


def test_percentile_is_nearest_rank():
    assert bench_serve.percentile([], 95) == 0.0
    assert bench_serve.percentile([3, 1, 2], 50) == 2
    assert bench_serve.percentile(list(range(1, 101)), 95) == 95 and bench_serve.percentile([5], 95) == 5


def test_serve_bench_quick(app_config, tmp_path, capsys):
    path = tmp_path / "BENCHMARKS.md"
    figures = bench_serve.run(app_config, quick(), path=path)
    printed = last_json_line(capsys)
    assert printed == figures
    expected = {"users", "ttft_p50_s", "ttft_p95_s", "tokens_per_s", "baseline_tokens_per_s", "ratio",
                "load_avg_1m_before_after"}
    if llama_cpp_installed():  # both engines side by side; llama.cpp itself on the GGUF the app serves
        expected |= {"llama_cpp_tokens_per_s", "llama_cpp_ttft_p95_s", "llama_cpp_vs_transformers",
                     "adapter_convert_and_load_s", "batch1_decode_tokens_per_s", "best_stream_tokens_per_s",
                     "best_stream_threads", "best_stream_gguf", "ceiling_tokens_per_s", "users8_vs_best_stream",
                     "users8_vs_ceiling", "ceiling_vs_best_stream", "greedy_identical", "batch1_vs_best_stream"}
        assert figures["llama_cpp_tokens_per_s"] > 0 and 0 <= figures["adapter_convert_and_load_s"] < 10
    assert set(figures) == expected
    assert figures["users"] == 8 and figures["tokens_per_s"] > 0 and figures["baseline_tokens_per_s"] > 0
    assert 0 < figures["ttft_p50_s"] <= figures["ttft_p95_s"]
    text = path.read_text()
    assert "## serve" in text and "baseline" in text and "Machine:" in text and "| 8 |" in text
    assert "errors" in text and '"ratio"' in text


def test_ingest_bench_quick_loses_nothing(app_config, tmp_path, capsys):
    figures = bench_ingest.run(app_config, quick(), path=tmp_path / "BENCHMARKS.md")
    assert last_json_line(capsys) == figures
    assert figures["errors"] == 0 and figures["lost_rows"] == 0
    assert all(figures[f"store_writes_per_s_{n}"] > 0 for n in (1, 16, 128)) and figures["votes_per_s"] > 0
    assert "POST /api/v1/comparisons" in (tmp_path / "BENCHMARKS.md").read_text()


def test_memory_bench_quick(app_config, tmp_path, capsys):
    figures = bench_memory.run(app_config, quick(), path=tmp_path / "BENCHMARKS.md")
    assert last_json_line(capsys) == figures
    assert figures["rss_10_mb"] >= figures["rss_1_mb"] > 0 and figures["ratio"] >= 1.0
    if llama_cpp_installed():
        assert figures["llama_cpp_rss_10_mb"] >= figures["llama_cpp_rss_1_mb"] > 0
    assert figures["adapter_file_mb"] > 0


def test_serve_during_retrain_quick(app_config, tmp_path, capsys):
    """Idle chat, a real retrain alone, then chat while the same retrain runs in the app's job runner."""
    path = tmp_path / "BENCHMARKS.md"
    from bench import serve_retrain

    from rlhf.config import apply_overrides

    # a job takes every core after half a second without chat: each round starts with a pause and a lone reply
    config = apply_overrides(app_config, {"retrain.idle_cores_after_seconds": 0.5})
    figures = serve_retrain.run(config, quick(during_retrain=True), path=path)
    assert last_json_line(capsys) == figures
    pause = {"ttft_after_pause_p95_s", "ttft_after_pause_max_s"}
    assert set(figures) - pause == {"users", "tokens_per_s", "idle_tokens_per_s", "ratio_vs_idle", "ttft_p95_s",
                                    "job_seconds", "idle_job_seconds"}
    if pause <= set(figures):  # the job outlived a pause
        assert 0 < figures["ttft_after_pause_p95_s"] <= figures["ttft_after_pause_max_s"]
        assert "first reply after a pause" in path.read_text()
    assert figures["users"] == 8 and figures["tokens_per_s"] > 0 and figures["idle_tokens_per_s"] > 0
    assert figures["ratio_vs_idle"] == pytest.approx(figures["tokens_per_s"] / figures["idle_tokens_per_s"], abs=0.01)
    assert figures["job_seconds"] > 0 and figures["idle_job_seconds"] > 0 and figures["ttft_p95_s"] > 0
    text = path.read_text()
    assert "## serve during retrain" in text and "retrain alone" in text and "CPU budget" in text
