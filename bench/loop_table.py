"""`bench loop` across preferences, as the table a default is chosen by (#40): every oracle x votes x method x
seed, one JSON line per retrain, then mean and worst over preferences per method and vote count.

One cell (an oracle at one vote count) per process, every method and seed in it on the same votes, so many cells
run side by side on one GPU: ``python -m bench.loop_table run --oracle polite --votes 32 --out polite-32.jsonl``;
then ``python -m bench.loop_table table *.jsonl`` prints the markdown table, and ``python -m bench.loop_table watch
*.jsonl --rise 0.015`` where PPO's voice watch would have stopped each run, from the rollouts' trace a row keeps.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
import statistics
import sys
from pathlib import Path

from bench.verdict import guard_voice, keeps_voice, published_win

# #40's goals: the mean win rate over preferences a default must reach at each vote count.
GOALS = {16: 0.65, 32: 0.75, 64: 0.85}


def run_cell(config, oracle: str, votes: int, methods: list[str], seeds: list[int], out: Path, eval_prompts: int,
             samples: int, variant: str = "") -> None:
    """Votes -> reward model -> policy -> oracle verdict for each method and seed; a JSON line per retrain.
    ``variant``: the config overrides this cell ran with (``--set``), kept in each line so the table keeps a
    method's variants apart."""
    from bench.loop import one_oracle
    from rlhf.base_models import pick_device, resolve_model
    from rlhf.config import apply_overrides
    from rlhf.simulate.preference_pool import load_pool
    from rlhf.training.features import ReplyFeatures, feature_cache
    from rlhf.training.methods import get_method

    source = resolve_model(config.base_model, config.data_path)
    device = pick_device(config.device)
    featurize = feature_cache(ReplyFeatures.load(source, device, config.reward.max_length))
    pool = load_pool()
    for seed in seeds:
        for method in methods:
            cfg = apply_overrides(config, {"retrain.method": method, "ppo.seed": seed,
                                           f"{get_method(method).section}.seed": seed})
            row = one_oracle(cfg, source, device, featurize, pool, oracle, votes, eval_prompts, samples, gate=False)
            gate_view = cfg.ppo.voice_check_gate and cfg.ppo.voice_check_tokens > 0
            with open(out, "a") as f:
                f.write(json.dumps({**row, "votes_asked": votes, "device": device, "variant": variant,
                                    "guard_voice": guard_voice(row["method_metrics"], gate_view)}) + "\n")


def method_label(row: dict) -> str:
    """A run's method, with the config overrides it ran with: a method's variants stay apart."""
    return f'{row["method"]} ({row["variant"]})' if row.get("variant") else row["method"]


def summarise(rows: list[dict]) -> list[dict]:
    """Per method and vote count: each oracle's seed-mean, then the mean and the worst over oracles."""
    cells: dict[tuple, dict[str, list[dict]]] = {}
    for r in rows:
        cells.setdefault((method_label(r), r["votes_asked"]), {}).setdefault(r["oracle"], []).append(r)
    out = []
    for (method, votes), by_oracle in sorted(cells.items()):
        mean = lambda runs, k: statistics.mean(x[k] for x in runs)  # noqa: E731
        wins = {o: mean(runs, "oracle_win_rate") for o, runs in by_oracle.items()}
        runs = [x for rs in by_oracle.values() for x in rs]
        drops = {o: mean(rs, "base_distinct_2") - mean(rs, "distinct_2") for o, rs in by_oracle.items()}
        rises = {o: mean(rs, "repetition") - mean(rs, "base_repetition") for o, rs in by_oracle.items()}
        lengths = {o: mean(rs, "mean_words") / mean(rs, "base_mean_words") for o, rs in by_oracle.items()}
        out.append({"method": method, "votes": votes, "oracles": len(by_oracle), "runs": len(runs),
                    "mean_win": statistics.mean(wins.values()), "worst_win": min(wins.values()),
                    "worst_oracle": min(wins, key=wins.get), "mean_distinct_drop": statistics.mean(drops.values()),
                    "worst_distinct_drop": max(drops.values()), "worst_repetition_rise": max(rises.values()),
                    "shortest": min(lengths.values()), "shortest_oracle": min(lengths, key=lengths.get),
                    "kl": statistics.mean(x["kl"] for x in runs), "voice_kept": sum(map(keeps_voice, runs)),
                    "train_s": statistics.mean(x["train_s"] for x in runs),
                    "reward_s": statistics.mean(x.get("reward_s", 0.0) for x in runs),
                    "goal": GOALS.get(votes), "distinct_drops": drops,
                    "pairs": statistics.mean(x["pairs"] for x in runs), "wins": wins, **published(by_oracle)})
    return out


def published(by_oracle: dict[str, list[dict]]) -> dict:
    """How many runs the gate's guard would publish by its voice rules, and the mean over oracles of what the team
    gets (``published_win``); both None unless every run says."""
    wins = {o: [published_win(x) for x in runs] for o, runs in by_oracle.items()}
    if any(w is None for ws in wins.values() for w in ws):
        return {"published": None, "published_win": None}
    return {"published": sum(bool(x.get("guard_voice")) for rs in by_oracle.values() for x in rs),
            "published_win": statistics.mean(statistics.mean(ws) for ws in wins.values())}


def markdown(rows: list[dict]) -> str:
    """The table: one line per method and vote count, against #40's goal; then each preference's win rate."""
    lines = ["| method | votes | win rate mean (goal) | worst (oracle) | distinct-2 drop mean / worst | repeated "
             "3-grams rise worst | words vs base, fewest (oracle) | KL | voice kept | guard publishes (win mean) | "
             "reward model s | policy s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    summary = summarise(rows)
    for s in summary:
        met = s["goal"] is not None and round(s["mean_win"], 6) >= s["goal"]
        goal = "" if s["goal"] is None else f" ({'met' if met else 'not'} {s['goal']:.2f})"
        lines.append(f"| {s['method']} | {s['votes']} | {s['mean_win']:.2f}{goal} | {s['worst_win']:.2f} "
                     f"({s['worst_oracle']}) | {s['mean_distinct_drop']:+.3f} / {s['worst_distinct_drop']:+.3f} | "
                     f"{s['worst_repetition_rise']:+.3f} | {s['shortest']:.2f} ({s['shortest_oracle']}) | "
                     f"{s['kl']:.2f} | {s['voice_kept']}/{s['runs']} | {guard_cell(s)} | {s['reward_s']:.0f} | "
                     f"{s['train_s']:.0f} |")
    return "\n".join(lines) + "\n\n" + per_oracle(summary)


def guard_cell(s: dict) -> str:
    """"published/runs (mean win rate with refused runs at 0.5)", or - where the rows do not say."""
    return "-" if s["published"] is None else f"{s['published']}/{s['runs']} ({s['published_win']:.2f})"


def per_oracle(summary: list[dict]) -> str:
    """Each preference's seed-mean win rate (and distinct-2 lost) per method and vote count; - where not run."""
    oracles = sorted({o for s in summary for o in s["wins"]})
    lines = ["| method | votes | " + " | ".join(oracles) + " |", "|---|---|" + "---|" * len(oracles)]
    for s in summary:
        cells = [f"{s['wins'][o]:.2f} ({-s['distinct_drops'][o]:+.2f})" if o in s["wins"] else "-" for o in oracles]
        lines.append(f"| {s['method']} | {s['votes']} | " + " | ".join(cells) + " |")
    return "Per preference: win rate vs base (distinct-2 change vs base).\n\n" + "\n".join(lines) + "\n"


def relabel(rows: list[dict], label: str) -> list[dict]:
    """Every row as one method named ``label``, for rows that are one retrain spelled by different overrides (a
    default measured before and after a setting that does not touch those cells). Two rows of one cell refuse."""
    cells = Counter((r["oracle"], r["seed"], r["votes_asked"]) for r in rows)
    twice = sorted(str(k) for k, n in cells.items() if n > 1)
    if twice:
        raise ValueError(f"--label merges one row per (oracle, seed, votes); these cells have two or more: "
                         f"{', '.join(twice)}")
    return [{**r, "method": label, "variant": ""} for r in rows]


def watch_replay(rows: list[dict], rise: float, drop: float, window: int) -> list[dict]:
    """Where PPO's voice watch with these thresholds (``ppo.stop_repetition_rise``, ``ppo.stop_distinct_drop``,
    ``ppo.stop_window``) would have stopped each row's run, replayed on the rollouts' trace the row keeps, beside
    the verdict on the run's own end. Up to a stop a watched run is the unwatched one, so the trace says where it
    would stop; what the kept weights would have scored needs the run. Rows without a trace are left out."""
    from rlhf.training.ppo.voice_watch import voice_drift

    out = []
    for r in rows:
        if not r.get("voice_trace"):
            continue
        history = [{"voice/distinct2": d, "voice/repetition": rep} for d, rep in r["voice_trace"]]
        stop = next((k for k in range(1, len(history) + 1) if voice_drift(history[:k], rise, drop, window)), None)
        out.append({"method": method_label(r), "oracle": r["oracle"], "votes": r["votes_asked"], "seed": r["seed"],
                    "win_rate": r["oracle_win_rate"], "voice_kept": keeps_voice(r), "steps": len(history),
                    # step k's rollouts came from the weights after step k-1, vouched for by step k-1's check
                    "stop": stop, "kept_step": None if stop is None else max(0, stop - 2)})
    return out


def watch_markdown(replay: list[dict]) -> str:
    """The replay as a table, then how many runs the watch would stop that lost the voice, stop that kept it, and
    leave that lost it."""
    lines = ["| method | votes | preference | seed | win rate | voice (the run's end) | the watch |",
             "|---|---|---|---|---|---|---|"]
    for x in sorted(replay, key=lambda x: (x["method"], x["votes"], x["oracle"], x["seed"])):
        action = "runs on" if x["stop"] is None else f'stops at step {x["stop"]} of {x["steps"]}, keeps step ' \
                                                       f'{x["kept_step"]}'
        lines.append(f'| {x["method"]} | {x["votes"]} | {x["oracle"]} | {x["seed"]} | {x["win_rate"]:.2f} | '
                     f'{"kept" if x["voice_kept"] else "lost"} | {action} |')
    needed = sum(x["stop"] is not None and not x["voice_kept"] for x in replay)
    needless = sum(x["stop"] is not None and x["voice_kept"] for x in replay)
    missed = sum(x["stop"] is None and not x["voice_kept"] for x in replay)
    return "\n".join(lines) + (f"\n\nOf {len(replay)} runs with a trace the watch stops {needed + needless}: {needed} "
                               f"that lost the voice, {needless} that kept it; it lets {missed} that lost it run "
                               f"on.\n")


def plot(rows: list[dict], path: Path) -> Path:
    """Win rate against distinct-2, a line per preference (and method variant) through its vote counts."""
    from bench.plot import tradeoff_svg

    points = [{**r, "oracle": f'{r["oracle"]} · {method_label(r)}', "knob": f'votes={r["votes_asked"]}'} for r in rows]
    return tradeoff_svg(points, path, title="The retrain across vote counts: win rate vs distinct-2")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loop_table")
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="one oracle at one vote count: every method x seed, JSON lines")
    run.add_argument("--oracle", required=True)
    run.add_argument("--votes", type=int, required=True)
    run.add_argument("--methods", default="ppo,dpo,rpo,online_dpo")
    run.add_argument("--seeds", default="0,1")
    run.add_argument("--eval-prompts", type=int, default=24)
    run.add_argument("--samples", type=int, default=2)
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--set", action="append", default=[], help="config KEY=VALUE")
    table = sub.add_parser("table", help="the markdown table of JSON-line files")
    table.add_argument("files", nargs="+", type=Path)
    table.add_argument("--plot", metavar="SVG", type=Path,
                       help="also draw win rate vs distinct-2 per preference, one point per vote count")
    table.add_argument("--label", help="show every row as this one method (one row per oracle, seed and votes)")
    watch = sub.add_parser("watch", help="where PPO's voice watch would have stopped each run (from its trace)")
    watch.add_argument("files", nargs="+", type=Path)
    watch.add_argument("--rise", type=float, default=0.015, help="ppo.stop_repetition_rise to replay (0 = off)")
    watch.add_argument("--drop", type=float, default=0.0, help="ppo.stop_distinct_drop to replay (0 = off)")
    watch.add_argument("--window", type=int, default=2, help="ppo.stop_window to replay")
    watch.add_argument("--label", help="show every row as this one method (one row per oracle, seed and votes)")
    args = p.parse_args(argv)
    if args.cmd == "run":
        from rlhf.config import load_config

        config = load_config(overrides=args.set)
        run_cell(config, args.oracle, args.votes, [m for m in args.methods.split(",") if m],
                 [int(s) for s in args.seeds.split(",") if s], args.out, args.eval_prompts, args.samples,
                 ",".join(args.set))
        return 0
    if args.cmd == "watch" and (min(args.rise, args.drop) < 0 or max(args.rise, args.drop) <= 0 or args.window < 1):
        p.error("--rise and --drop must be >= 0, one of them > 0, and --window >= 1")
    rows = [json.loads(line) for f in args.files for line in f.read_text().splitlines() if line.strip()]
    if args.label:
        try:
            rows = relabel(rows, args.label)
        except ValueError as e:
            p.error(str(e))
    if args.cmd == "watch":
        sys.stdout.write(watch_markdown(watch_replay(rows, args.rise, args.drop, args.window)))
        return 0
    sys.stdout.write(markdown(rows))
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
