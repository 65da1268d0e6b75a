"""`rlhf-studio bench queue`: does the vote queue's background refill cost chat anything, and how fast is the
next item after a vote?

On the configured model, in one process with the REST app on loopback: (1) an annotator chats through
``POST /api/v1/chat/stream`` with pauses between messages, in alternating blocks with the refill off and on
(on, it always wants more items: ``queue.target_ready`` is raised), and time to first token is compared;
(2) with a warm queue, an annotator votes and asks for the next item, and the time from sending the vote to
holding the next item is measured, while the refill keeps running (and refits its reward head on the votes).
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Optional

from bench.report import report
from bench.serve import QUESTIONS, LiveApp, bench_config, load_policy_server, percentile
from rlhf.config import AppConfig, apply_overrides


def chat_ttft(client, k: int, rng: random.Random, max_new_tokens: int = 48) -> float:
    """Seconds to the first token of one streamed chat, then a random 0.8–3 s pause (reading the reply)."""
    body = {"messages": [{"role": "user", "content": QUESTIONS[k % len(QUESTIONS)]}], "seed": k,
            "max_new_tokens": max_new_tokens, "annotator": "bench-chat"}
    t0 = time.perf_counter()
    first = None
    with client.stream("POST", "/api/v1/chat/stream", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line and first is None and "delta" in json.loads(line):
                first = time.perf_counter() - t0
    time.sleep(rng.uniform(0.8, 3.0))  # the refill may start meanwhile
    return first if first is not None else time.perf_counter() - t0


def next_after_vote(url: str, votes: int, pause: float = 0.3) -> list[float]:
    """Seconds from sending a vote to holding the next item, ``votes`` times (items must be waiting), with a
    short pause per item, so the refill thread refits and rescores while the votes come in."""
    import httpx

    times = []
    with httpx.Client(base_url=url, timeout=60) as client:
        item = client.get("/queue/next", params={"annotator": "bench-voter"}).json()
        for k in range(votes):
            time.sleep(pause)
            t0 = time.perf_counter()
            client.post(f"/queue/{item['item_id']}/vote", json={"winner": "ab"[k % 2], "annotator": "bench-voter"}
                        ).raise_for_status()
            r = client.get("/queue/next", params={"annotator": "bench-voter"})
            times.append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise RuntimeError(f"the warm queue ran dry after {k + 1} votes ({r.status_code})")
            item = r.json()
    return times


def warm_items(store, n: int) -> None:
    """``n`` ready items with canned replies (the vote timing needs items, not generation)."""
    from rlhf.simulate.preference_pool import load_pool

    policy = store.active_policy("assistant").id
    for rec in load_pool()[:n]:
        store.create_queue_item("assistant", [{"role": "user", "content": rec["prompt"]}],
                                [{"content": rec["replies"][0], "policy_id": policy},
                                 {"content": rec["replies"][1], "policy_id": policy}])


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's flags (`rlhf-studio bench queue ...`)."""
    p.add_argument("--quick", action="store_true", help="smaller run (smoke test of the benchmark itself)")


def run(config: AppConfig, args: argparse.Namespace, path: Optional[Path] = None) -> dict:
    """Chat TTFT with the refill off and on, then vote→next latency on a warm queue."""
    import httpx

    from rlhf.vote_queue.refill import QueueRefill
    from storage import Store
    from ui.webapp import create_app
    from ui.services import Services

    quick = bool(getattr(args, "quick", False))
    blocks, n_votes = (2, 24) if quick else (8, 60)
    keep_busy = {"queue.low_water": 10_000, "queue.target_ready": 10_000}
    refill_config = apply_overrides(config, keep_busy)  # the real data dir: its scoring head loads the base model
    server = load_policy_server(config)
    alone, busy, counts = [], [], {"batches": 0, "preempted": 0, "items": 0}
    with tempfile.TemporaryDirectory() as tmp:
        app_config = apply_overrides(bench_config(config, tmp), keep_busy)
        store = Store(app_config.db_path)
        store.ensure_default_agent(config.base_model)
        services = Services(config=app_config, store=store, server=server)
        try:
            with LiveApp(create_app(services, ui=False)) as live, httpx.Client(base_url=live.url, timeout=600) as c:
                rng, k = random.Random(1), 0
                # Blocks of two chats with the refill off, then two with it on: whatever else loads the machine
                # weighs on both alike.
                for _ in range(blocks):
                    for _ in range(2):
                        alone.append(chat_ttft(c, k, rng))
                        k += 1
                    refill = QueueRefill(store, refill_config, lambda agent: server, seed=k).start()
                    for _ in range(2):
                        busy.append(chat_ttft(c, k, rng))
                        k += 1
                    refill.stop(timeout=120)
                    counts = {key: counts[key] + refill.counts[key] for key in counts}
                warm_items(store, n_votes + 8)
                refill = services.refill = QueueRefill(store, refill_config, lambda agent: server, seed=0).start()
                votes = next_after_vote(live.url + "/api/v1", n_votes)
                refill.stop(timeout=120)
        finally:
            server.close()
            store.close()
    rows = [{"phase": "chat, refill off", "n": len(alone), "p50": round(percentile(alone, 50), 3),
             "p95": round(percentile(alone, 95), 3), "unit": "s to first token"},
            {"phase": "chat, refill on", "n": len(busy), "p50": round(percentile(busy, 50), 3),
             "p95": round(percentile(busy, 95), 3), "unit": "s to first token"},
            {"phase": "vote → next item", "n": len(votes), "p50": round(1000 * percentile(votes, 50), 1),
             "p95": round(1000 * percentile(votes, 95), 1), "unit": "ms"}]
    figures = {"ttft_alone_p50_s": rows[0]["p50"], "ttft_alone_p95_s": rows[0]["p95"],
               "ttft_refill_p50_s": rows[1]["p50"], "ttft_refill_p95_s": rows[1]["p95"],
               "refill_batches": counts["batches"], "refill_preempted": counts["preempted"],
               "refill_items": counts["items"], "next_after_vote_p50_ms": rows[2]["p50"],
               "next_after_vote_p95_ms": rows[2]["p95"], "refits_while_voting": refill.counts["refits"],
               "scored_while_voting": refill.counts["scored"]}
    notes = ("One annotator chats (streamed, 48 new tokens, 0.8–3 s pauses), in blocks of two chats with the vote "
             "queue's refill off and two while it tries to generate items non-stop (it waits for 0.5 s of engine "
             "idleness, sends one item's prompts per prefill, and cancels its batch when a chat arrives); then votes "
             "on a warm queue (0.3 s per item) while the refill keeps generating, refitting and rescoring. Goal: "
             "next item within 300 ms p95 of a vote; chat TTFT not worse with the refill on.")
    return report("bench queue", rows, figures, notes, path=path)
