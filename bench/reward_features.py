"""Would the reward model learn more from few votes with features that carry style? (#40, item 4)

The app's reward model reads each reply through the frozen base: hidden states averaged over the reply's tokens at
three depths, the last token's state and the log length (``rlhf.training.features``). Every built-in oracle of #40
but `concise` counts something in a reply (polite phrases, list lines, paragraphs, contractions, examples, hedges),
and an average cannot count. This benchmark fits the same head on the same votes with other feature sets, built
from the pool's default features so nothing is extracted twice:

- ``default``: the app's features;
- ``sum``: plus each averaged state times the reply's token count (a sum over the reply: counts, not shares);
- ``words``: plus the reply's word counts (a bag of words over the pool's vocabulary, words in 3+ replies).

Votes are `bench loop`'s (one oracle-labelled pair per train prompt, ties dropped, seeded); the held-out pairs are
every decided pair of the four replies to each held-out prompt. Because most of these oracles count things that a
longer reply holds more of, accuracy is also reported on the held-out pairs whose chosen reply is the shorter:
a feature set that only learned "longer wins" gains nothing there.

``python -m bench.reward_features [--votes 16,32,64] [--seeds 0,1]``
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from typing import Sequence

import numpy as np

FEATURE_SETS = ("default", "sum", "words")


def feature_sets(default: np.ndarray, texts: Sequence[str], depths: int) -> dict[str, np.ndarray]:
    """The feature sets per reply from the default matrix (columns: ``depths`` averaged states of one width, the
    last token's state, log1p(tokens)) and the replies' text."""
    from sklearn.feature_extraction.text import CountVectorizer

    width = (default.shape[1] - 1) // (depths + 1)
    tokens = np.expm1(default[:, -1:])
    sums = default[:, :depths * width] * tokens
    counts = CountVectorizer(lowercase=True, min_df=3, token_pattern=r"[a-z']+").fit_transform(texts).toarray()
    return {"default": default, "sum": np.hstack([default, sums]),
            "words": np.hstack([default, counts.astype(default.dtype)])}


def heldout_decided(pool: list[dict], oracle: str, prompt_ids) -> list[dict]:
    """Every decided pair of the replies to the given prompts, labelled by the oracle."""
    from rlhf.simulate.oracles import ORACLES

    judge, allowed, out = ORACLES[oracle], set(prompt_ids), []
    for rec in pool:
        if rec["prompt_id"] not in allowed:
            continue
        for a, b in itertools.combinations(rec["replies"], 2):
            winner = judge(rec["prompt"], a, b)
            if winner != "tie":
                chosen, rejected = (a, b) if winner == "a" else (b, a)
                out.append({"prompt": rec["prompt"], "chosen": chosen, "rejected": rejected})
    return out


def chosen_shorter(pairs: Sequence[dict]) -> list[dict]:
    """The pairs whose chosen reply has fewer words: length cannot have told the model which wins."""
    return [p for p in pairs if len(p["chosen"].split()) < len(p["rejected"].split())]


def accuracies(matrix: np.ndarray, index: dict, train: list[dict], held: Sequence[list[dict]], c: float,
               members: int, seed: int) -> list[float]:
    """Accuracy (ties half) on each held-out set of the app's head, fitted once on ``train`` with one matrix."""
    from rlhf.training.reward_head import fit_pairs, pair_accuracy

    rows = lambda pairs, side: matrix[[index[(p["prompt"], p[side])] for p in pairs]]  # noqa: E731
    head = fit_pairs(rows(train, "chosen"), rows(train, "rejected"), c=c, members=members, seed=seed)
    return [pair_accuracy(head, rows(h, "chosen"), rows(h, "rejected")) if h else float("nan") for h in held]


def run(config, votes: Sequence[int], seeds: Sequence[int]) -> list[dict]:
    """One row per oracle, vote count and feature set: held-out accuracy (mean over seeds), all pairs and the
    chosen-shorter ones."""
    from bench.loop import oracle_pairs
    from bench.reward import pool_features
    from rlhf.base_models import pick_device, resolve_model
    from rlhf.simulate.oracles import ORACLES
    from rlhf.simulate.preference_pool import load_pool, split_prompts
    from rlhf.training.features import ReplyFeatures

    pool = load_pool()
    source = resolve_model(config.base_model, config.data_path)
    featurize = ReplyFeatures.load(source, pick_device(config.device), config.reward.max_length)
    feats = pool_features(config, featurize, pool)
    texts = [reply for (_, reply) in sorted(feats.index, key=feats.index.get)]
    sets = feature_sets(feats.matrix.astype(np.float64), texts, len(featurize.layers))
    train_ids, held_ids = split_prompts(pool)
    r = config.reward
    out = []
    for oracle in ORACLES:
        held = heldout_decided(pool, oracle, held_ids)
        short = chosen_shorter(held)
        for n in votes:
            trains = [oracle_pairs(pool, oracle, train_ids, n, seed=s) for s in seeds]
            for name, matrix in sets.items():
                acc, acc_short = zip(*(accuracies(matrix, feats.index, t, [held, short], r.head_c, r.ensemble,
                                                  r.seed) for t in trains))
                out.append({"oracle": oracle, "votes": n, "features": name, "held_out": len(held),
                            "chosen_shorter": len(short), "accuracy": round(statistics.mean(acc), 3),
                            "accuracy_chosen_shorter": round(statistics.mean(acc_short), 3)})
        print(f"{oracle}: done", file=sys.stderr)
    return out


def table(rows: list[dict]) -> str:
    """Markdown: per vote count and feature set, the mean over oracles and each oracle (all / chosen shorter)."""
    oracles = list(dict.fromkeys(r["oracle"] for r in rows))
    lines = ["| votes | features | mean: all / chosen shorter | " + " | ".join(oracles) + " |",
             "|---|---|---|" + "---|" * len(oracles)]
    keys = list(dict.fromkeys((r["votes"], r["features"]) for r in rows))
    for votes, name in keys:
        cell = {r["oracle"]: r for r in rows if (r["votes"], r["features"]) == (votes, name)}
        mean = lambda k: statistics.mean(cell[o][k] for o in oracles)  # noqa: E731
        lines.append(f"| {votes} | {name} | {mean('accuracy'):.3f} / {mean('accuracy_chosen_shorter'):.3f} | "
                     + " | ".join(f"{cell[o]['accuracy']:.2f} / {cell[o]['accuracy_chosen_shorter']:.2f}"
                                  for o in oracles) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    from rlhf.config import load_config

    p = argparse.ArgumentParser(prog="python -m bench.reward_features", description=__doc__.splitlines()[0])
    p.add_argument("--votes", default="16,32,64", help="vote counts, comma-separated")
    p.add_argument("--seeds", default="0,1", help="vote seeds, comma-separated")
    args = p.parse_args(argv)
    rows = run(load_config(), [int(v) for v in args.votes.split(",")], [int(s) for s in args.seeds.split(",")])
    print(table(rows))


if __name__ == "__main__":
    main()
