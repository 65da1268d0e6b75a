"""llama.cpp lanes decode one after the other: the order is drawn again every step, so no version always goes first
(a fixed order made an arena round's first side the adapter version's, round after round)."""
from __future__ import annotations

import random
from types import SimpleNamespace

from scipy.stats import binomtest

from rlhf.serving.llama_cpp.lanes import decode_order


def test_busy_lanes_decode_in_a_fresh_random_order_each_step():
    lanes = [SimpleNamespace(name=n, seqs=[1]) for n in ("lora", "base")] + [SimpleNamespace(name="idle", seqs=[])]
    rng = random.Random(7)
    orders = [[lane.name for lane in decode_order(lanes, rng)] for _ in range(200)]
    assert all(sorted(order) == ["base", "lora"] for order in orders)  # idle lanes skipped, busy ones all there
    lora_first = sum(order[0] == "lora" for order in orders)
    assert binomtest(lora_first, len(orders)).pvalue > 0.01, lora_first
    assert [lane.name for lane in lanes] == ["lora", "base", "idle"]  # the engine's own list is left as it was
