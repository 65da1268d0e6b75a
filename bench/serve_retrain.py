"""`rlhf-studio bench serve --during-retrain`: chat speed while a real retrain job trains, against idle chat and
an unloaded retrain measured in the same run.

1. The retrain alone: a throwaway Store seeded with votes from the shipped preference pool, one retrain job run
   by the job runner in its own process, nothing else on the machine from us (``idle_job_seconds``).
2. Idle chat: the real app over loopback HTTP, 1 and 8 annotators (as in ``bench serve``).
3. The same retrain (same votes, same config, from the base version again) started by the app's own runner, so
   the app's CPU budget applies; the 1- and 8-annotator levels run in turn, again and again, until it ends
   (``job_seconds``; chat figures aggregate every level that started while the job ran). Where the budget lets a
   job take every core while nobody chats (``retrain.idle_cores_after_seconds``), each round starts with that long
   a pause and then one lone reply: the reply that takes chat's cores back from the job (``after_quiet``).
"""
from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from bench.report import report
from bench.retrain import AGENT, QUICK, RetrainRun, retrain_config, seed_votes
from bench.serve_load import Level, LiveApp, bench_config, load_policy_server, percentile, run_level
from rlhf.config import AppConfig


def _merge(total: Level, level: Level) -> None:
    total.ttft += level.ttft
    total.tokens += level.tokens
    total.requests += level.requests
    total.busy += level.busy
    total.errors += level.errors
    total.wall_s += level.wall_s


def _row(mode: str, level: Level, threads) -> dict:
    return {"mode": mode, "users": level.users, "requests": level.requests, "tokens": level.tokens,
            "wall_s": level.wall_s, "tokens_per_s": level.tokens / level.wall_s if level.wall_s else 0.0,
            "ttft_p50_s": percentile(level.ttft, 50), "ttft_p95_s": percentile(level.ttft, 95),
            "errors": len(level.errors), "serving_threads": threads or "", "job_s": ""}


def _job_row(mode: str, seconds: float, phases: dict) -> dict:
    split = " ".join(f"{k} {v:.0f}s" for k, v in phases.items() if v >= 0.5)
    return {"mode": f"{mode} ({split})" if split else mode, "users": "", "requests": "", "tokens": "", "wall_s": "",
            "tokens_per_s": "", "ttft_p50_s": "", "ttft_p95_s": "", "errors": "", "serving_threads": "",
            "job_s": seconds}


class JobTicker:
    """Ticks the app's job runner (the scheduler is off in benchmarks) until stopped."""

    def __init__(self, runner, every: float = 0.5):
        self.runner, self.every, self.stop = runner, every, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            self.runner.tick()

    def __enter__(self) -> "JobTicker":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


@dataclass
class _Chat:
    """What the app measured: idle levels, the levels while the retrain ran, one level after it."""

    idle: dict
    idle_threads: dict
    budget: Any  # the app's CPU budget (the job runner's)
    during: dict = field(default_factory=dict)
    threads_seen: dict = field(default_factory=dict)
    job_seconds: float = 0.0
    done: Any = None  # the job as it ended
    after: Optional[Level] = None
    after_threads: Optional[int] = None
    after_quiet: Optional[Level] = None  # lone replies after a pause long enough for the job to take every core
    quiet_shares: set = field(default_factory=set)  # the job's share when each of those replies started


def run(config: AppConfig, args, path=None) -> dict:
    """Idle chat, the retrain alone, then chat during the same retrain; report and return the figures."""
    from rlhf.base_models import resolve_model

    quick = bool(getattr(args, "quick", False))
    levels = [args.users] if getattr(args, "users", None) else [1, 8]
    gen = {"max_new_tokens": 16 if quick else 64, "temperature": config.serving.temperature,
           "top_p": config.serving.top_p}
    per_user = 1 if quick else 2
    n_pairs = 16 if quick else 64
    job_config = {"base_model": resolve_model(config.base_model, config.data_path), **(dict(QUICK) if quick else {})}
    with tempfile.TemporaryDirectory(prefix="bench-serve-retrain-") as tmp:
        idle_job = _retrain_alone(config, Path(tmp) / "alone", quick, n_pairs)
        chat = _chat_idle_then_during_retrain(config, Path(tmp) / "app", levels, per_user, gen, n_pairs, job_config)
    if chat.done.status != "succeeded":
        raise RuntimeError(f"the retrain under load failed: {chat.done.error}")
    pick = 8 if 8 in levels else levels[-1]
    during, idle = chat.during[pick], chat.idle[pick]
    tps = during.tokens / during.wall_s if during.wall_s else 0.0
    idle_tps = idle.tokens / idle.wall_s if idle.wall_s else 0.0
    quiet = chat.after_quiet
    figures = {"users": pick, "tokens_per_s": round(tps, 2), "idle_tokens_per_s": round(idle_tps, 2),
               **({"ttft_after_pause_p95_s": round(percentile(quiet.ttft, 95), 3),
                   "ttft_after_pause_max_s": round(max(quiet.ttft), 3)} if quiet and quiet.ttft else {}),
               "ratio_vs_idle": round(tps / idle_tps, 3) if idle_tps else 0.0,
               "ttft_p95_s": round(percentile(during.ttft, 95), 3), "job_seconds": round(chat.job_seconds, 1),
               "idle_job_seconds": idle_job["seconds"]}
    notes = _notes(config, quick, n_pairs, per_user, gen, chat, idle_job)
    return report("serve during retrain", _rows(chat, levels, idle_job), figures, notes, path=path)


def _retrain_alone(config: AppConfig, data_dir: Path, quick: bool, n_pairs: int) -> dict:
    """1. The retrain alone, run by the job runner in its own process with nothing else of ours on the machine."""
    alone = RetrainRun(retrain_config(config, data_dir, quick), n_pairs, label="alone")
    alone.start()
    idle_job = alone.wait()
    if idle_job["status"] != "succeeded":
        raise RuntimeError(f"the unloaded retrain failed: {idle_job['error']}")
    return idle_job


def _chat_idle_then_during_retrain(config: AppConfig, data_dir: Path, levels: list[int], per_user: int, gen: dict,
                                   n_pairs: int, job_config: dict) -> _Chat:
    """2. Idle chat on the real app over loopback HTTP, then 3. chat during the same retrain, run by the app's own
    runner (the CPU budget applies)."""
    from ui.webapp import build_services, create_app

    cfg = bench_config(config, str(data_dir))
    server = load_policy_server(config)
    services = build_services(cfg, server=server)
    try:
        with LiveApp(create_app(services)) as live:
            chat = _Chat({}, {}, services.scheduler.runner.budget)
            for users in levels:
                chat.idle[users] = run_level(live.url, users, per_user, gen)
                chat.idle_threads[users] = server.engine.threads
            seed_votes(services.store, n_pairs)
            job = services.scheduler.enqueue("retrain", AGENT, job_config, reason="bench")
            _chat_during_job(services, server, live.url, job.id, levels, per_user, gen, chat)
    finally:
        services.close()
    return chat


def _chat_during_job(services, server, url: str, job_id: int, levels: list[int], per_user: int, gen: dict,
                     chat: _Chat) -> None:
    """The levels in turn, again and again, until the job ends (into ``chat``); then one level once the job's
    process has exited and serving took its cores back."""
    chat.during = {users: Level(users) for users in levels}
    chat.threads_seen = {users: set() for users in levels}
    plan = chat.budget.plan
    t0 = time.perf_counter()
    with JobTicker(services.scheduler.runner):
        while not services.store.get_job(job_id).done:
            if plan.job_most > plan.job:  # a pause: the job takes every core; then the reply that takes them back
                time.sleep(plan.idle_after_s + 2.0)
                if services.store.get_job(job_id).done:
                    break
                chat.quiet_shares.add(chat.budget.job_share())
                chat.after_quiet = chat.after_quiet or Level(1)
                _merge(chat.after_quiet, run_level(url, 1, 1, gen))
            for users in levels:
                if services.store.get_job(job_id).done:
                    break
                chat.threads_seen[users].add(server.engine.threads)
                _merge(chat.during[users], run_level(url, users, per_user, gen))
                chat.threads_seen[users].add(server.engine.threads)
        chat.job_seconds = time.perf_counter() - t0
        chat.done = services.store.get_job(job_id)
        deadline = time.monotonic() + 60
        while chat.budget.job_threads and time.monotonic() < deadline:  # the job process exits
            time.sleep(0.2)
        chat.after = run_level(url, levels[0], 1, gen)  # serving took its cores back
        chat.after_threads = server.engine.threads


def _rows(chat: _Chat, levels: list[int], idle_job: dict) -> list[dict]:
    rows = [_job_row("retrain alone", idle_job["seconds"], idle_job["phase_seconds"])]
    rows += [_row("idle: HTTP stream, batched", chat.idle[u], chat.idle_threads[u]) for u in levels]
    rows += [_row("during retrain: HTTP stream, batched", chat.during[u],
                  "/".join(str(t) for t in sorted(t for t in chat.threads_seen[u] if t))) for u in levels]
    if chat.after_quiet is not None:
        share = "/".join(str(t) for t in sorted(chat.quiet_shares))
        rows.append(_row(f"during retrain: first reply after a pause (job on {share} threads)", chat.after_quiet,
                         chat.budget.plan.serving_busy))
    rows.append(_job_row("retrain under chat load", chat.job_seconds, chat.done.result.get("phase_seconds", {})))
    rows.append(_row("after the retrain", chat.after, chat.after_threads))
    return rows


def _notes(config: AppConfig, quick: bool, n_pairs: int, per_user: int, gen: dict, chat: _Chat,
           idle_job: dict) -> str:
    plan = chat.budget.plan
    errors = [e for lv in list(chat.idle.values()) + list(chat.during.values()) for e in lv.errors]
    return (f"Model `{config.base_model}`; retrain config: {'the --quick one (' + str(QUICK) + ')' if quick else 'the default'}"
            f", {n_pairs} votes from the shipped preference pool, the same for both retrains (each starts from the "
            f"base version). {per_user} chat(s) per annotator per level, max_new_tokens={gen['max_new_tokens']}, "
            f"temperature={gen['temperature']}; during the retrain the levels ran in turn until it ended. CPU budget: "
            f"{plan.describe()}. The retrain took {chat.job_seconds / idle_job['seconds']:.2f}x its unloaded time under "
            f"chat load. Goal: >= 0.45x idle tokens/s at 8 users and TTFT p95 <= 2 s during a retrain."
            + (f" Errors: {errors[:3]}" if errors else ""))
