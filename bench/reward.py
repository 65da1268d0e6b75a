"""`rlhf-studio bench reward`: does the reward model learn what annotators prefer from 16–256 votes?

On the shipped preference pool (real replies of the default model, ``assets/preference_pool.jsonl.gz``), each
planted preference labels pairs of replies to the same prompt. For 16, 32, 64, 128 and 256 training pairs and
several seeds, a reward model is fitted and judged on a fixed held-out set of ≥ 200 pairs whose prompts it
never saw. Baselines in the same run: a length-only logistic model (does a model learn more than length?) and
the LoRA reward model the app trained before the linear head (``reward.method=lora``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from bench.preferences import PREFERENCES, heldout_pairs, make_pairs
from rlhf.simulate.preference_pool import load_pool, split_prompts
from bench.report import report
from rlhf.config import AppConfig

PAIRS = (16, 32, 64, 128, 256)
QUICK_PAIRS = (32, 64)
SEEDS = (0, 1, 2)

Fit = Callable[[list[dict]], Callable[[list[dict]], np.ndarray]]  # train pairs -> (pairs -> P(chosen wins) > .5)


def prompt_of(pair: dict) -> list[dict]:
    return [{"role": "user", "content": pair["prompt"]}]


class PoolFeatures:
    """Features of every reply in the pool, computed once (a progress bar on stderr).

    With ``cache_dir`` the matrix is also kept on disk, named by a hash of ``cache_key`` (which model, length,
    depths) and the replies: a second benchmark run on the same pool and model skips the extraction.
    """

    def __init__(self, featurize, pool: list[dict], batch: int = 64, cache_dir: Optional[Path] = None,
                 cache_key: str = ""):
        from tqdm import tqdm

        self.index: dict[tuple[str, str], int] = {}
        prompts, replies = [], []
        for rec in pool:
            for reply in rec["replies"]:
                key = (rec["prompt"], reply)
                if key not in self.index:
                    self.index[key] = len(replies)
                    prompts.append([{"role": "user", "content": rec["prompt"]}])
                    replies.append(reply)
        digest = hashlib.sha256(json.dumps([cache_key, list(self.index)]).encode()).hexdigest()[:16]
        path = Path(cache_dir) / f"pool-features-{digest}.npy" if cache_dir else None
        if path is not None and path.is_file():
            self.matrix = np.load(path)
            return
        chunks = []
        for start in tqdm(range(0, len(replies), batch), desc="reply features", file=sys.stderr, unit="batch"):
            chunks.append(featurize(prompts[start:start + batch], replies[start:start + batch]))
        self.matrix = np.concatenate(chunks) if chunks else np.zeros((0, 1), np.float32)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}.npy")
            np.save(tmp, self.matrix)
            os.replace(tmp, path)  # whole or absent: a killed run leaves no half file

    def of(self, pairs: Sequence[dict], side: str) -> np.ndarray:
        return self.matrix[[self.index[(p["prompt"], p[side])] for p in pairs]]


def pool_features(config: AppConfig, featurize, pool: list[dict]) -> PoolFeatures:
    """The pool's features, cached under ``<data_dir>/cache/`` by model, length and feature depths."""
    from rlhf.training.features import DEFAULT_DEPTHS

    key = json.dumps([config.base_model, config.reward.max_length, list(DEFAULT_DEPTHS), str(featurize.device),
                      featurize.layers])
    return PoolFeatures(featurize, pool, cache_dir=config.data_path / "cache", cache_key=key)


def head_fit(features: PoolFeatures, c: Optional[float] = None) -> Fit:
    """The app's reward model: the linear head ensemble on frozen features."""
    from rlhf.training.reward_head import DEFAULT_C, fit_pairs

    def fit(train: list[dict]):
        head = fit_pairs(features.of(train, "chosen"), features.of(train, "rejected"), c=c or DEFAULT_C)
        return lambda pairs: head.scores(features.of(pairs, "chosen")) - head.scores(features.of(pairs, "rejected"))

    return fit


def length_fit() -> Fit:
    """Logistic regression on the difference of log word counts (with an intercept-free symmetric fit)."""
    from sklearn.linear_model import LogisticRegression

    def feat(pairs):
        return np.array([[math.log1p(len(p["chosen"].split())) - math.log1p(len(p["rejected"].split()))]
                         for p in pairs])

    def fit(train: list[dict]):
        d = feat(train)
        model = LogisticRegression(fit_intercept=False).fit(np.concatenate([d, -d]),
                                                             np.r_[np.ones(len(d)), np.zeros(len(d))])
        return lambda pairs: feat(pairs)[:, 0] * model.coef_[0, 0]

    return fit


def lora_fit(config: AppConfig, source: str) -> Fit:
    """The reward model as the app trained it before the linear head: LoRA + score head, TRL RewardTrainer."""
    from rlhf.training.reward_lora import train_lora_on_pairs

    def fit(train: list[dict]):
        rows = [{"prompt": prompt_of(p), "chosen": p["chosen"], "rejected": p["rejected"], "margin": 0.0}
                for p in train]
        scorer = train_lora_on_pairs(rows, config, source)

        def diff(pairs):
            s = scorer([prompt_of(p) for p in pairs] * 2, [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs])
            return np.array(s[:len(pairs)]) - np.array(s[len(pairs):])

        return diff

    return fit


def accuracy(diffs: np.ndarray) -> float:
    """Share of held-out pairs ordered right (ties count half)."""
    return float(np.mean(np.where(diffs > 0, 1.0, np.where(diffs == 0, 0.5, 0.0))))


def learning_curve(fit: Fit, pool: list[dict], preference: str, train_ids, held: list[dict],
                   sizes: Sequence[int], seeds: Sequence[int]) -> dict[int, list[float]]:
    """Held-out accuracy per training size, one value per seed."""
    curve: dict[int, list[float]] = {n: [] for n in sizes}
    for seed in seeds:
        for n in sizes:
            train = make_pairs(pool, preference, train_ids, seed=seed + 1, n=n)
            curve[n].append(accuracy(fit(train)(held)))
    return curve


def timed_fit_at(n: int, featurize, pool, preference: str, train_ids) -> float:
    """Seconds for one cold fit at ``n`` pairs: features of its 2n replies (no cache) + the head."""
    from rlhf.training.reward_head import fit_pairs

    train = make_pairs(pool, preference, train_ids, seed=99, n=n)
    t0 = time.perf_counter()
    xc = featurize([prompt_of(p) for p in train], [p["chosen"] for p in train])
    xr = featurize([prompt_of(p) for p in train], [p["rejected"] for p in train])
    fit_pairs(xc, xr)
    return time.perf_counter() - t0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's flags (`rlhf-studio bench reward ...`)."""
    p.add_argument("--quick", action="store_true", help="smaller run (smoke test of the benchmark itself)")
    p.add_argument("--preference", help="one planted preference instead of all")
    p.add_argument("--no-baseline", action="store_true", help="skip the slow LoRA baseline")
    p.add_argument("--active", action="store_true",
                   help="votes to 0.80 held-out accuracy, vote-queue (uncertainty) pairs against random ones")


def run(config: AppConfig, args: argparse.Namespace) -> dict:
    """Learning curves for every planted preference, with the two baselines; appends to BENCHMARKS.md.
    (``bench reward --active`` runs ``bench.reward_active`` instead.)"""
    from rlhf.base_models import pick_device, resolve_model
    from rlhf.training.features import ReplyFeatures

    quick = bool(getattr(args, "quick", False))
    sizes = QUICK_PAIRS if quick else PAIRS
    seeds = SEEDS[:1] if quick else SEEDS
    only = getattr(args, "preference", None)
    prefs = [only] if only else list(PREFERENCES)
    pool = load_pool()
    train_ids, _ = split_prompts(pool)
    source = resolve_model(config.base_model, config.data_path)
    featurize = ReplyFeatures.load(source, pick_device(config.device), config.reward.max_length)
    feats = pool_features(config, featurize, pool)
    fits = {"head": head_fit(feats), "length": length_fit()}
    rows, curves = [], {}
    for pref in prefs:
        held = heldout_pairs(pool, pref)
        for name, fit in fits.items():
            curve = learning_curve(fit, pool, pref, train_ids, held, sizes, seeds)
            curves[(pref, name)] = curve
            rows.append({"preference": pref, "model": name, "held_out_pairs": len(held),
                         **{f"acc@{n}": _fmt(curve[n]) for n in sizes}})
        print(f"{pref}: " + ", ".join(f"{n}: {statistics.mean(curves[(pref, 'head')][n]):.3f}" for n in sizes),
              file=sys.stderr)
    lora_at_64 = {}
    if not getattr(args, "no_baseline", False):
        lora = lora_fit(config, source)
        for pref in prefs:
            held = heldout_pairs(pool, pref)
            lora_at_64[pref] = accuracy(lora(make_pairs(pool, pref, train_ids, seed=1, n=64))(held))
            rows.append({"preference": pref, "model": "lora (before)", "held_out_pairs": len(held),
                         **{f"acc@{n}": (f"{lora_at_64[pref]:.3f}" if n == 64 else "") for n in sizes}})
    fit_s = timed_fit_at(64, featurize, pool, prefs[0], train_ids)
    mean_at = lambda n, model="head": _mean([statistics.mean(curves[(p, model)][n]) for p in prefs]) \
        if n in sizes else None  # noqa: E731
    figures = {
        "pairs": list(sizes),
        "accuracy": {p: [round(statistics.mean(curves[(p, "head")][n]), 4) for n in sizes] for p in prefs},
        "spread": {p: [round(_sd(curves[(p, "head")][n]), 4) for n in sizes] for p in prefs},
        "length_accuracy": {p: [round(statistics.mean(curves[(p, "length")][n]), 4) for n in sizes] for p in prefs},
        "seeds": len(seeds), "mean_at_32": mean_at(32), "mean_at_64": mean_at(64),
        "baseline_mean_at_64": _mean(list(lora_at_64.values())) if lora_at_64 else None,
        "length_baseline_mean_at_64": mean_at(64, "length"), "fit_seconds_at_64": round(fit_s, 2),
    }
    notes = ("Held-out pairwise accuracy (mean ± spread over seeds) of the app's reward model (`head`: linear "
             "ensemble on frozen features) against a length-only logistic model and the LoRA reward model the "
             "app trained before (one seed at 64 pairs). Goal: mean ≥ 0.80 at 64 pairs, ≥ 0.70 at 32.")
    return report("bench reward", rows, figures, notes)


def _mean(xs: list[float]) -> Optional[float]:
    return round(statistics.mean(xs), 4) if xs else None


def _sd(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def _fmt(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f} ± {_sd(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"
