"""`rlhf-studio bench serve --during-retrain`: chat speed while a real retrain job trains, against idle chat and
an unloaded retrain measured in the same run.

1. The retrain alone: a throwaway Store seeded with votes from the shipped preference pool, one retrain job run
   by the job runner in its own process, nothing else on the machine from us (``idle_job_seconds``).
2. Idle chat: the real app over loopback HTTP, 1 and 8 annotators (as in ``bench serve``).
3. The same retrain (same votes, same config, from the base version again) started by the app's own runner, so
   the app's CPU budget applies; the 1- and 8-annotator levels run in turn, again and again, until it ends
   (``job_seconds``; chat figures aggregate every level that started while the job ran).
"""
from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

from bench.report import report
from bench.retrain import AGENT, QUICK, RetrainRun, retrain_config, seed_votes
from bench.serve import Level, LiveApp, bench_config, load_policy_server, percentile, run_level
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


class _Ticker:
    """Ticks the app's job runner (the scheduler is off in benchmarks) until stopped."""

    def __init__(self, runner, every: float = 0.5):
        self.runner, self.every, self.stop = runner, every, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            self.runner.tick()

    def __enter__(self) -> "_Ticker":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def run(config: AppConfig, args, path=None) -> dict:
    """Idle chat, the retrain alone, then chat during the same retrain; report and return the figures."""
    from rlhf.base_models import resolve_model
    from ui.webapp import build_services, create_app

    quick = bool(getattr(args, "quick", False))
    levels = [args.users] if getattr(args, "users", None) else [1, 8]
    gen = {"max_new_tokens": 16 if quick else 64, "temperature": config.serving.temperature,
           "top_p": config.serving.top_p}
    per_user = 1 if quick else 2
    n_pairs = 16 if quick else 64
    job_settings = dict(QUICK) if quick else {}
    source = resolve_model(config.base_model, config.data_path)
    with tempfile.TemporaryDirectory(prefix="bench-serve-retrain-") as tmp:
        # 1. The retrain alone
        alone = RetrainRun(retrain_config(config, Path(tmp) / "alone", quick), n_pairs, label="alone")
        alone.start()
        idle_job = alone.wait()
        if idle_job["status"] != "succeeded":
            raise RuntimeError(f"the unloaded retrain failed: {idle_job['error']}")
        cfg = bench_config(config, str(Path(tmp) / "app"))
        server = load_policy_server(config)
        services = build_services(cfg, server=server)
        budget = services.scheduler.runner.budget
        try:
            with LiveApp(create_app(services)) as live:
                # 2. Idle chat
                idle, idle_threads = {}, {}
                for users in levels:
                    idle[users] = run_level(live.url, users, per_user, gen)
                    idle_threads[users] = server.engine.threads
                # 3. Chat during the same retrain, run by the app's runner (the CPU budget applies)
                seed_votes(services.store, n_pairs)
                job = services.scheduler.enqueue("retrain", AGENT, {"base_model": source, **job_settings},
                                                 reason="bench")
                during = {users: Level(users) for users in levels}
                threads_seen: dict[int, set] = {users: set() for users in levels}
                t0 = time.perf_counter()
                with _Ticker(services.scheduler.runner):
                    while not services.store.get_job(job.id).done:
                        for users in levels:
                            if services.store.get_job(job.id).done:
                                break
                            threads_seen[users].add(server.engine.threads)
                            _merge(during[users], run_level(live.url, users, per_user, gen))
                            threads_seen[users].add(server.engine.threads)
                    job_seconds = time.perf_counter() - t0
                    done = services.store.get_job(job.id)
                    deadline = time.monotonic() + 60
                    while budget.job_threads and time.monotonic() < deadline:  # the job process exits
                        time.sleep(0.2)
                    after = run_level(live.url, levels[0], 1, gen)  # serving took its cores back
                    after_threads = server.engine.threads
        finally:
            services.close()
    if done.status != "succeeded":
        raise RuntimeError(f"the retrain under load failed: {done.error}")
    pick = 8 if 8 in levels else levels[-1]
    rows = [_job_row("retrain alone", idle_job["seconds"], idle_job["phase_seconds"])]
    rows += [_row("idle: HTTP stream, batched", idle[u], idle_threads[u]) for u in levels]
    rows += [_row("during retrain: HTTP stream, batched", during[u],
                  "/".join(str(t) for t in sorted(t for t in threads_seen[u] if t))) for u in levels]
    rows.append(_job_row("retrain under chat load", job_seconds, done.result.get("phase_seconds", {})))
    rows.append(_row("after the retrain", after, after_threads))
    tps = during[pick].tokens / during[pick].wall_s if during[pick].wall_s else 0.0
    idle_tps = idle[pick].tokens / idle[pick].wall_s if idle[pick].wall_s else 0.0
    figures = {"users": pick, "tokens_per_s": round(tps, 2), "idle_tokens_per_s": round(idle_tps, 2),
               "ratio_vs_idle": round(tps / idle_tps, 3) if idle_tps else 0.0,
               "ttft_p95_s": round(percentile(during[pick].ttft, 95), 3), "job_seconds": round(job_seconds, 1),
               "idle_job_seconds": idle_job["seconds"]}
    plan = budget.plan
    errors = [e for lv in list(idle.values()) + list(during.values()) for e in lv.errors]
    notes = (f"Model `{config.base_model}`; retrain config: {'the --quick one (' + str(QUICK) + ')' if quick else 'the default'}"
             f", {n_pairs} votes from the shipped preference pool, the same for both retrains (each starts from the "
             f"base version). {per_user} chat(s) per annotator per level, max_new_tokens={gen['max_new_tokens']}, "
             f"temperature={gen['temperature']}; during the retrain the levels ran in turn until it ended. CPU budget: "
             f"{plan.describe()}. The retrain took {job_seconds / idle_job['seconds']:.2f}x its unloaded time under "
             f"chat load. Goal: >= 0.45x idle tokens/s at 8 users and TTFT p95 <= 2 s during a retrain."
             + (f" Errors: {errors[:3]}" if errors else ""))
    return report("serve during retrain", rows, figures, notes, path=path)
