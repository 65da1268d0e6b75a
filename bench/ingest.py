"""`rlhf-studio bench ingest`: how fast feedback lands, and that none of it is lost.

Store level: rating writes through ``Store.record_rating`` from 1, 16 and 128 threads (one connection per
thread, WAL, ``BEGIN IMMEDIATE``). HTTP level: votes through ``POST /api/v1/comparisons`` from 32 concurrent
clients against the real app. Every write carries something new (a note, or a changed winner), so each success
must be exactly one new row: ``lost`` counts successes without their row, ``errors`` counts failed calls.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.report import report, run_together
from bench.serve import LiveApp, bench_config, load_policy_server
from rlhf.config import AppConfig


def seed_replies(store, n_contexts: int) -> list[tuple[int, int]]:
    """``n_contexts`` conversations, each a user turn with two sibling replies; returns the reply id pairs."""
    pairs = []
    agent = store.get_agent(None)  # the default agent
    for i in range(n_contexts):
        conv = store.create_conversation(agent.id, "bench", source="api",
                                         messages=[{"role": "user", "content": f"question {i}"}])
        user = store.leaf(conv.id)
        a = store.record_reply(user.id, f"answer A {i}", None)
        b = store.record_reply(user.id, f"answer B {i}", None)
        pairs.append((a.id, b.id))
    return pairs


def store_writes(store, replies: list[int], threads: int, total: int) -> dict:
    """``total`` rating writes spread over ``threads`` threads; rate, errors and rows lost."""
    per_thread = max(1, total // threads)
    before = store.count("ratings")
    ok, errors = [0] * threads, [0] * threads

    def writer(t: int) -> None:
        for k in range(per_thread):
            try:
                store.record_rating(replies[(t * per_thread + k) % len(replies)], f"writer-{t}",
                                    score=1 + k % 5, note=f"t{threads}-{t}-{k}")  # a new note: always a new row
                ok[t] += 1
            except Exception:  # counted and reported
                errors[t] += 1

    wall = run_together(writer, threads)
    written = store.count("ratings") - before
    return {"ok": sum(ok), "errors": sum(errors), "lost": sum(ok) - written, "wall_s": wall,
            "per_s": sum(ok) / wall if wall else 0.0}


def http_votes(url: str, pairs: list[tuple[int, int]], clients: int, per_client: int) -> dict:
    """``clients`` threads posting comparisons; the winner flips on every repeat, so each vote is a new row."""
    import httpx

    ok, errors = [0] * clients, [0] * clients

    def voter(c: int) -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            for k in range(per_client):
                a, b = pairs[k % len(pairs)]
                winner = "a" if (k // len(pairs)) % 2 == 0 else "b"
                try:
                    r = client.post("/api/v1/comparisons", json={"message_a_id": a, "message_b_id": b,
                                                                 "winner": winner, "annotator": f"voter-{c}"})
                    if r.status_code == 200:
                        ok[c] += 1
                    else:
                        errors[c] += 1
                except httpx.HTTPError:
                    errors[c] += 1

    wall = run_together(voter, clients)
    return {"ok": sum(ok), "errors": sum(errors), "wall_s": wall, "per_s": sum(ok) / wall if wall else 0.0}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's flags (`rlhf-studio bench ingest ...`)."""
    p.add_argument("--quick", action="store_true", help="smaller run (smoke test of the benchmark itself)")


def run(config: AppConfig, args, path=None) -> dict:
    """Store writes at 1/16/128 threads and HTTP votes at 32 clients; report and return the figures."""
    from storage import Store
    from ui.webapp import build_services, create_app

    quick = bool(getattr(args, "quick", False))
    total = 256 if quick else 4096
    clients, per_client = 32, (4 if quick else 32)
    rows, figures = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        store = Store(Path(tmp) / "store" / "studio.db")
        store.ensure_default_agent(config.base_model)
        replies = [i for pair in seed_replies(store, 64) for i in pair]
        for threads in (1, 16, 128):
            r = store_writes(store, replies, threads, total)
            rows.append({"path": "Store.record_rating", "concurrency": threads, "writes": r["ok"],
                         "wall_s": r["wall_s"], "per_s": r["per_s"], "errors": r["errors"], "lost": r["lost"]})
            figures[f"store_writes_per_s_{threads}"] = round(r["per_s"], 1)
        store.close()

        cfg = bench_config(config, str(Path(tmp) / "app"))
        services = build_services(cfg, server=load_policy_server(config, warmup=False))
        try:
            pairs = seed_replies(services.store, 16)
            before = services.store.count("comparisons")
            with LiveApp(create_app(services)) as live:
                v = http_votes(live.url, pairs, clients, per_client)
            lost = v["ok"] - (services.store.count("comparisons") - before)
        finally:
            services.close()
        rows.append({"path": "POST /api/v1/comparisons", "concurrency": clients, "writes": v["ok"],
                     "wall_s": v["wall_s"], "per_s": v["per_s"], "errors": v["errors"], "lost": lost})
    store_rows = [r for r in rows if r["path"].startswith("Store")]
    figures.update({"store_writes_per_s": round(min(r["per_s"] for r in store_rows), 1),
                    "votes_per_s": round(v["per_s"], 1), "http_clients": clients,
                    "errors": sum(r["errors"] for r in rows), "lost_rows": sum(r["lost"] for r in rows)})
    notes = (f"{total} rating writes per Store level (each a new row: a fresh note), {clients}×{per_client} votes "
             "over HTTP (the winner flips on repeats, so each is a new row). `store_writes_per_s` is the slowest "
             "Store level; `lost` = successful calls without their row.")
    return report("ingest", rows, figures, notes, path=path)
