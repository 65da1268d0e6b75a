"""`rlhf-studio bench loop`: does a retrain on N votes move the policy toward what the annotators prefer?

The learning path alone, without the app around it, so a change to the reward model or PPO can be judged in
minutes and on preferences that are not length. For each built-in oracle of ``rlhf-studio simulate``:

1. N votes: pairs of the shipped pool's real replies on the train prompts, labelled by the oracle (ties
   dropped) — what N arena votes give the app.
2. The app's reward model on them (linear-head ensemble on frozen features, the ``reward.*`` config) with its
   grouped k-fold accuracy.
3. PPO from the base with the ``ppo.*`` config (defaults unless ``--set``) on the pool's train prompts.
4. The verdict: the oracle judges the new version against the base on held-out prompts nobody voted on
   (``--eval-prompts``, two sampled replies each), plus fluency of the new replies (mean words, distinct-2), and
   for scale what a perfect best-of-4 reranker of the base's own replies would score (``best_of_pool``).
5. The gate: the retrain job's own verdict (promote / inconclusive / reject) on the same adapter, so whether
   it agrees with the oracle is measured too.

``simulate --retrain`` measures the same thing through the running app (live votes, the real job); this one
is the fast, repeatable bench for the learning path.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from bench.report import report
from bench.verdict import SAMPLES, agrees, best_of_pool, chat, gate_verdict, keeps_voice, verdict
from rlhf.config import AppConfig, ConfigError

EVAL_PROMPTS = 32  # held-out prompts judged per oracle (of the pool's 160): `--eval-prompts`


def oracle_pairs(pool: list[dict], oracle: str, prompt_ids, n: int, seed: int = 0) -> list[dict]:
    """Up to ``n`` oracle-labelled pairs ``{prompt_id, prompt, chosen, rejected}``, one per prompt, seeded order."""
    from rlhf.simulate.oracles import ORACLES

    judge = ORACLES[oracle]
    allowed = set(prompt_ids)
    records = sorted((r for r in pool if r["prompt_id"] in allowed), key=lambda r: r["prompt_id"])
    rng = random.Random(seed)
    rng.shuffle(records)
    pairs = []
    for rec in records:
        a, b = rng.sample(rec["replies"], 2)
        winner = judge(rec["prompt"], a, b)
        if winner == "tie":
            continue
        chosen, rejected = (a, b) if winner == "a" else (b, a)
        pairs.append({"prompt_id": rec["prompt_id"], "prompt": rec["prompt"], "chosen": chosen, "rejected": rejected})
        if len(pairs) == n:
            break
    return pairs


def queue_pairs(config: AppConfig, featurize, pool: list[dict], oracle: str, prompt_ids, votes: int, strategy: str,
                system: str, seed: int = 0) -> list[dict]:
    """``votes`` votes on pairs chosen the vote queue's way (``active``) or at random, from every pair of the
    pool's four replies per prompt; a tie is a vote spent that teaches nothing. Returns the decided pairs."""
    from bench.reward_active import annotate
    from rlhf.simulate.oracles import ORACLES

    judge, allowed = ORACLES[oracle], set(prompt_ids)
    cands = [{"prompt_id": rec["prompt_id"], "prompt": rec["prompt"], "a": a, "b": b}
             for rec in sorted((r for r in pool if r["prompt_id"] in allowed), key=lambda r: r["prompt_id"])
             for i, a in enumerate(rec["replies"]) for b in rec["replies"][i + 1:]]
    winners = [judge(c["prompt"], c["a"], c["b"]) for c in cands]
    chats = [chat(system, c["prompt"]) for c in cands]
    xa, xb = featurize(chats, [c["a"] for c in cands]), featurize(chats, [c["b"] for c in cands])
    taken: list[int] = []
    for taken, _ in annotate(xa, xb, winners, strategy, seed, votes, config.queue.refit_every,
                             config.reward.min_pairs, config.queue.random_share, config.reward.head_c,
                             config.reward.ensemble):
        pass
    return [{"prompt_id": cands[i]["prompt_id"], "prompt": cands[i]["prompt"],
             "chosen": cands[i]["a"] if winners[i] == "a" else cands[i]["b"],
             "rejected": cands[i]["b"] if winners[i] == "a" else cands[i]["a"]}
            for i in taken if winners[i] != "tie"]


def fit_reward(config: AppConfig, featurize, pairs: list[dict], system: str):
    """The retrain's reward models on ``pairs``, split as the job splits them (``rlhf.training.judge``): PPO's
    head on its share with grouped CV figures, and the gate's judge on the rest -> (scorer, cv, judge, evidence,
    the policy's pairs: what DPO learns from)."""
    from rlhf.retrain.gate import Evidence
    from rlhf.training.judge import fit_judge, judge_split
    from rlhf.training.reward import HeadScorer
    from rlhf.training.reward_head import cross_validate_pairs, fit_pairs

    prompts = [chat(system, p["prompt"]) for p in pairs]
    xc = featurize(prompts, [p["chosen"] for p in pairs])
    xr = featurize(prompts, [p["rejected"] for p in pairs])
    r, g = config.reward, config.gate
    groups = [p["prompt_id"] for p in pairs]
    mine, theirs = judge_split(groups, g.judge_share, g.min_judge_pairs, r.seed)
    cv = cross_validate_pairs(xc[mine], xr[mine], [groups[i] for i in mine], k=r.cv_folds, c=r.head_c,
                              permutations=r.cv_permutations)
    head = fit_pairs(xc[mine], xr[mine], c=r.head_c, members=r.ensemble, seed=r.seed)
    judge_head, judged = fit_judge(xc, xr, theirs, mine, r.head_c, r.ensemble, r.seed)
    evidence = Evidence.from_metrics({**cv, **judged}, prefix="")
    judge = HeadScorer(featurize, judge_head, {}) if judge_head is not None else None
    return HeadScorer(featurize, head, {}), cv, judge, evidence, [pairs[i] for i in mine]


class PeakMemory:
    """Peak resident memory of this process while the block runs (sampled every 50 ms), and what it added."""

    def __enter__(self):
        import threading

        import psutil

        self._proc, self._stop = psutil.Process(), threading.Event()
        self.before = self.peak = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    def figures(self) -> dict:
        return {"peak_rss_mb": round(self.peak / 2**20), "train_mb": round((self.peak - self.before) / 2**20)}


def train_policy(config: AppConfig, source: str, device: str, scorer, policy_pairs: list[dict], prompts: list,
                 eval_prompts: list, run_dir: Path):
    """The retrain's policy step (``retrain.method``: PPO on the reward model, or DPO on the votes) from the base,
    with the held-out ``eval_prompts`` the app's retrain gives it (PPO's final evaluation and voice check)."""
    from rlhf.training.policy import train_policy as train

    def progress(step: int, metrics: dict) -> None:  # one line per step on stderr, for whoever watches
        shown = {k: round(v, 3) for k, v in metrics.items() if k in (
            "reward/mean", "ppo/kl", "ppo/entropy", "loss/policy", "dpo/reward_accuracy", "voice/distinct2",
            "voice/repetition", "voice/relevance", "votes/margin")}
        print(f"[{config.retrain.method} step {step}] {shown}", file=sys.stderr, flush=True)

    return train(config, source, scorer, policy_pairs, prompts, eval_prompts, run_dir, device=device,
                 on_step=progress, evaluate_before=False)


def one_oracle(config: AppConfig, source: str, device: str, featurize, pool, oracle: str, n_pairs: int,
               eval_prompts: int, samples: int, votes_from: str = "pool", gate: bool = True) -> dict:
    """Votes -> reward model -> policy (``retrain.method``) -> the oracle's verdict, for one oracle. ``votes_from``:
    ``pool`` (one decided pair per prompt), or ``active`` / ``random`` (``n_pairs`` votes, ties included, chosen the
    vote queue's way or at random). ``gate``: also the retrain job's verdict on the same adapter."""
    from rlhf.simulate.preference_pool import split_prompts
    from rlhf.retrain.assess import adapters_on_base
    from rlhf.training.methods import get_method
    from storage.agents import DEFAULT_SYSTEM_PROMPT as system

    train_ids, held_ids = split_prompts(pool)
    text = {r["prompt_id"]: r["prompt"] for r in pool}
    seed = config.ppo.seed
    if votes_from == "pool":
        pairs = oracle_pairs(pool, oracle, train_ids, n_pairs, seed=seed)
    else:
        pairs = queue_pairs(config, featurize, pool, oracle, train_ids, n_pairs, votes_from, system, seed)
    t0 = time.perf_counter()
    scorer, cv, judge, evidence, policy_pairs = fit_reward(config, featurize, pairs, system)
    reward_s = time.perf_counter() - t0
    policy_pairs = [{**p, "prompt": chat(system, p["prompt"])} for p in policy_pairs]
    # The gate reads the last held-out prompts, the oracle the first: as in the app, neither was voted on, and the
    # policy step evaluates (and checks its voice) on the gate's.
    gate_prompts = [text[i] for i in held_ids[-config.ppo.eval_prompts:]]
    with tempfile.TemporaryDirectory(prefix=f"bench-loop-{oracle}-") as tmp:
        t0 = time.perf_counter()
        with PeakMemory() as memory:
            result = train_policy(config, source, device, scorer, policy_pairs,
                                  [chat(system, text[i]) for i in train_ids],
                                  [chat(system, p) for p in gate_prompts], Path(tmp) / "run")
        train_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        model, tokenizer = adapters_on_base(source, device, {"new": str(result.final_dir)})
        judged = verdict(model, tokenizer, oracle, [text[i] for i in held_ids[:eval_prompts]], system, samples)
        judged["best_of_pool"] = best_of_pool(pool, oracle, held_ids)
        if gate:
            judged.update(gate_verdict(config, model, tokenizer, scorer, judge, evidence, gate_prompts, system))
        eval_s = time.perf_counter() - t0
    history = result.history
    entropy = [m["ppo/entropy"] for m in history if "ppo/entropy" in m]
    return {"oracle": oracle, "method": config.retrain.method, "seed": seed, "votes_from": votes_from,
            "votes": n_pairs if votes_from != "pool" else len(pairs),
            "pairs": len(pairs), "rm_cv_accuracy": round(cv["cv_accuracy"] or 0.0, 3),
            "rm_cv_low": round(cv["cv_low"] or 0.0, 3), "rm_cv_high": round(cv["cv_high"] or 0.0, 3),
            **judged, "entropy_first": round(entropy[0], 3) if entropy else None,
            "entropy_last": round(entropy[-1], 3) if entropy else None,
            "voice_trace": [[round(m["voice/distinct2"], 3), round(m["voice/repetition"], 3)] for m in history
                            if "voice/repetition" in m],
            "reward_s": round(reward_s, 1), "train_s": round(train_s, 1), **memory.figures(),
            "method_metrics": get_method(config.retrain.method).result_metrics(result, len(policy_pairs)),
            "train_phases": {k: round(v, 1) for k, v in result.phase_seconds.items()},
            "eval_s": round(eval_s, 1)}


def parse_sweep(text: Optional[str]) -> tuple[Optional[str], list]:
    """``KEY=V1,V2,...`` -> (key, values as text); (None, [None]) without a sweep."""
    if not text:
        return None, [None]
    key, sep, values = text.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise ConfigError(f"--sweep expects KEY=V1,V2,..., got {text!r}")
    return key.strip(), [v.strip() for v in values.split(",") if v.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's flags (`rlhf-studio bench loop ...`)."""
    p.add_argument("--quick", action="store_true", help="smaller run (smoke test of the benchmark itself)")
    p.add_argument("--oracle", help="one built-in oracle instead of all")
    p.add_argument("--votes", type=int, help="oracle-labelled votes per oracle (default 64)")
    p.add_argument("--eval-prompts", type=int, help="held-out prompts the oracle judges (default 32, at most 160)")
    p.add_argument("--methods", help="comma-separated retrain methods to run on the same votes (ppo,dpo,rpo,"
                                     "online_dpo; default: retrain.method)")
    p.add_argument("--seeds", help="comma-separated seeds (votes, PPO/DPO, sampling; default: ppo.seed)")
    p.add_argument("--sweep", metavar="KEY=V1,V2", help="one run per value of a config key: the trade-off curve of "
                                                         "win rate vs distinct-2 for that knob")
    p.add_argument("--plot", metavar="SVG", help="with --sweep: write the trade-off curve there")
    p.add_argument("--no-gate", action="store_true", help="skip the gate's verdict (faster knob exploration)")
    p.add_argument("--active", action="store_true",
                   help="the loop's oracle win rate after N queue-chosen votes against N random ones")


def _runs(config: AppConfig, args: argparse.Namespace) -> list[tuple[dict, AppConfig]]:
    """(labels, config) per run: every method x seed x swept value, each config checked before any work."""
    from rlhf.config import apply_overrides
    from rlhf.training.methods import METHODS, get_method

    methods = [m.strip() for m in (getattr(args, "methods", None) or config.retrain.method).split(",") if m.strip()]
    seeds = [int(x) for x in (getattr(args, "seeds", None) or str(config.ppo.seed)).split(",") if x.strip()]
    key, values = parse_sweep(getattr(args, "sweep", None))
    out = []
    for value in values:
        for method in methods:
            for seed in seeds:
                overrides = {"retrain.method": method, "ppo.seed": seed}
                if method in METHODS:  # else the config check below names the choices
                    overrides[f"{get_method(method).section}.seed"] = seed
                if key is not None:
                    overrides[key] = value
                labels = {"knob": f"{key}={value}"} if key is not None else {}
                out.append((labels, apply_overrides(config, overrides)))
    return out


def run(config: AppConfig, args: argparse.Namespace, path: Optional[Path] = None) -> dict:
    """Every built-in oracle (or ``--oracle``) through votes -> reward model -> policy -> verdict; one table."""
    from tqdm import tqdm

    from rlhf.simulate.preference_pool import HELDOUT_PROMPTS, load_pool
    from rlhf.simulate.oracles import ORACLES
    from rlhf.base_models import pick_device, resolve_model
    from rlhf.training.features import ReplyFeatures, feature_cache

    quick = bool(getattr(args, "quick", False))
    oracles = [args.oracle] if getattr(args, "oracle", None) else (list(ORACLES)[:1] if quick else list(ORACLES))
    n_pairs = getattr(args, "votes", None)
    n_pairs = (16 if quick else 64) if n_pairs is None else n_pairs
    if set(oracles) - set(ORACLES):
        raise ConfigError(f"--oracle must be one of {', '.join(ORACLES)}, got {oracles[0]!r}")
    if n_pairs < 4:
        raise ConfigError(f"--votes must be at least 4 (the reward model's cross-validation needs pairs), "
                          f"got {n_pairs}")
    eval_prompts, samples = (4, 1) if quick else (EVAL_PROMPTS, SAMPLES)
    eval_prompts = eval_prompts if getattr(args, "eval_prompts", None) is None else args.eval_prompts
    if not 1 <= eval_prompts <= HELDOUT_PROMPTS:
        raise ConfigError(f"--eval-prompts must be in 1..{HELDOUT_PROMPTS} (the pool's held-out prompts), "
                          f"got {eval_prompts}")
    runs = _runs(config, args)
    source = resolve_model(config.base_model, config.data_path)
    device = pick_device(config.device)
    featurize = feature_cache(ReplyFeatures.load(source, device, config.reward.max_length))
    pool = load_pool()
    sources = ("active", "random") if getattr(args, "active", False) else ("pool",)
    gate = not getattr(args, "no_gate", False)
    rows = []
    todo = [(o, v, labels, cfg) for o in oracles for labels, cfg in runs for v in sources]
    for oracle, votes_from, labels, cfg in tqdm(todo, desc="loop", file=sys.stderr, unit="run"):
        rows.append({**labels, **one_oracle(cfg, source, device, featurize, pool, oracle, n_pairs, eval_prompts,
                                            samples, votes_from, gate)})
        print(f"{oracle} ({votes_from}, {labels or cfg.retrain.method}): oracle win rate "
              f"{rows[-1]['oracle_win_rate']}, distinct-2 {rows[-1]['distinct_2']}", file=sys.stderr)
    if sources != ("pool",):
        by = {(r["oracle"], r["votes_from"]): r["oracle_win_rate"] for r in rows}
        return report("loop --active", rows, {
            "votes": n_pairs, "active_win_rate": {o: by[(o, "active")] for o in oracles},
            "random_win_rate": {o: by[(o, "random")] for o in oracles}},
            f"The vote queue's choice against random choice, for the whole loop: {n_pairs} votes per run on pairs "
            "of the pool's four replies per training prompt (ties are votes that teach nothing), chosen like the "
            "queue does (random until `reward.min_pairs`, then the pairs the refit head ensemble is least sure "
            f"about, `queue.random_share` random) or at random; then the same reward model, PPO and verdict as "
            f"`bench loop` ({eval_prompts} held-out prompts x {samples} samples).", path=path)
    if getattr(args, "sweep", None) and getattr(args, "plot", None):
        from bench.plot import tradeoff_svg

        tradeoff_svg(rows, Path(args.plot), title=f"bench loop --sweep {parse_sweep(args.sweep)[0]}: win rate vs "
                                                  "distinct-2")
    figures = summary(rows, n_pairs)
    return report("loop", rows, figures, notes(config, device, n_pairs, eval_prompts, samples, gate), path=path)


def label(row: dict) -> str:
    """A run's key in the figures: oracle/method/seed (and the swept value)."""
    return "/".join(str(x) for x in (row["oracle"], row["method"], row["seed"], row.get("knob")) if x is not None)


def summary(rows: list[dict], n_pairs: int) -> dict:
    """The JSON figures: per run (oracle/method/seed) its win rate, voice and gate, and whether the goals hold."""
    wins = [r["oracle_win_rate"] for r in rows]
    per = lambda key: {label(r): r.get(key) for r in rows}  # noqa: E731
    return {"votes": n_pairs, "oracle_win_rate": per("oracle_win_rate"), "gate": per("gate"),
            "gate_agrees": all(agrees(r["gate"], r["oracle_win_rate"]) for r in rows if "gate" in r),
            "mean_win_rate": round(statistics.mean(wins), 3), "min_win_rate": min(wins),
            "distinct_2": per("distinct_2"), "repetition": per("repetition"), "kl": per("kl"),
            "keeps_voice": {label(r): keeps_voice(r) for r in rows}, "train_s": per("train_s"),
            "best_of_pool": {r["oracle"]: r["best_of_pool"] for r in rows}}


def notes(config: AppConfig, device: str, n_pairs: int, eval_prompts: int, samples: int, gate: bool) -> str:
    """What the table measured, for BENCHMARKS.md."""
    p, d = config.ppo, config.dpo
    return (f"Model `{config.base_model}` on {device}; {n_pairs} oracle-labelled pool pairs per oracle -> head "
            f"reward model -> the policy from the base: PPO ({p.steps} steps x {p.batch_size} prompts x "
            f"{p.group_size} replies, lr {p.learning_rate}, {p.ppo_epochs} epochs, KL coef {p.kl_init}, entropy coef "
            f"{p.ent_coef}) on that reward model, or DPO (TRL's DPOTrainer, beta {d.beta}, lr {d.learning_rate}, "
            f"{d.epochs} epochs) on the same votes the reward model learned from -> the oracle judges new vs base "
            f"on {eval_prompts} held-out prompts x {samples} samples (ties half; `decisive_win_rate` leaves ties "
            "out). Voice, on the same sampled replies (64 tokens, temperature 1) of the new version and the base: "
            "`distinct_2` (unique word bigrams over all), `repetition` (mean share of a reply's word 3-grams that "
            "repeat an earlier one), `kl` (KL to base, nats per reply, on the judged replies); goal (#35): "
            "distinct-2 within 0.05 of the base's, repetition at most the base's + 0.02. `train_s`: wall seconds "
            "of the policy step; `peak_rss_mb` / `train_mb`: this process's peak resident memory during it and what "
            "it added. `best_of_pool`: the oracle's favourite of the pool's 4 base replies against a random one of "
            "them on all 160 held-out prompts (a perfect best-of-4 reranker's score)."
            + (" `gate`: the retrain job's verdict on the same adapter (greedy replies to "
               f"{config.ppo.eval_prompts} other held-out prompts judged by the head fitted on the votes the policy's "
               "reward model never saw, bootstrap interval; `guard`: the reward-hacking checks that tripped on the "
               "same replies, `guard_*` candidate/base)." if gate else " Gate not run (--no-gate)."))
