"""The shipped preference pool (assets/preference_pool.jsonl.gz): prompts x sampled replies of the default model.

Reading it and its fixed train / held-out split lives here, where `simulate` and the benchmarks both use it;
generating it is `bench/preference_pool.py`.
"""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Optional, Sequence

from rlhf.assets import asset_path

POOL_PATH = asset_path("preference_pool.jsonl.gz")
HELDOUT_PROMPTS = 160  # of 320; at most 2 pairs each gives 200 held-out pairs per preference (152 is the least)


def read_meta(path: Optional[Path] = None) -> dict:
    """The header line of the pool file."""
    with gzip.open(path or POOL_PATH, "rt", encoding="utf-8") as f:
        return json.loads(f.readline())["meta"]


def load_pool(path: Optional[str | Path] = None) -> list[dict]:
    """The pool's prompt records (the meta line skipped)."""
    with gzip.open(Path(path) if path else POOL_PATH, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if "meta" not in r]


def split_prompts(pool: Sequence[dict], n_heldout: int = HELDOUT_PROMPTS, seed: int = 0) -> tuple[list, list]:
    """A fixed split of prompt ids into (train, held-out), disjoint."""
    ids = sorted(r["prompt_id"] for r in pool)
    random.Random(seed).shuffle(ids)
    return sorted(ids[n_heldout:]), sorted(ids[:n_heldout])
