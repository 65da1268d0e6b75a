"""Generating the shipped preference pool: prompts x sampled replies of the app's default model.

Replies come from the app's default model (SmolLM2-135M-Instruct) under varied style hints, so style
preferences are learnable (the planted preferences are `bench/preferences.py`). The prompt families, style
hints and their draw weights are data: assets/preference_pool/prompts.json.

    python -m bench.preference_pool generate   # writes assets/preference_pool.jsonl.gz (CPU: 18 min at 1 thread)
    python -m bench.preference_pool stats      # usable pairs and length-only baselines per preference
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional, Sequence

from bench.preferences import HELDOUT_SEED, PREFERENCES, _word_count, preference_stats
from bench.report import ROOT
from rlhf.simulate.oracles import words
from rlhf.simulate.preference_pool import POOL_PATH, load_pool, split_prompts

TABLES = json.loads((ROOT / "assets" / "preference_pool" / "prompts.json").read_text(encoding="utf-8"))
# family -> (templates, fillers). A filler is a string, or a tuple for templates with several slots.
FAMILIES: dict[str, tuple[tuple[str, ...], tuple]] = {
    name: (tuple(f["templates"]), tuple(tuple(x) if isinstance(x, list) else x for x in f["fillers"]))
    for name, f in TABLES["families"].items()}
# Style hints, appended to the user turn (SmolLM2-135M all but ignores them as a system prompt: measured).
# Each reply draws each style axis on its own, so within one prompt most axes vary and every planted
# preference finds pairs. A reply's hints are stored as a bitmask over HINTS; the stored prompt has none.
HINTS: tuple[str, ...] = tuple(TABLES["hints"])
AXES: tuple[tuple[tuple[Optional[int], ...], tuple[float, ...]], ...] = tuple(  # (hint choices, weights) per axis
    (tuple(a["hints"]), tuple(a["weights"])) for a in TABLES["axes"])


def _fill(template: str, filler) -> str:
    """One prompt from a template and its filler."""
    return template.format(*filler) if isinstance(filler, tuple) else template.format(filler)


def build_prompts(n: int = 320, seed: int = 0) -> list[str]:
    """``n`` distinct prompts: every filler once (random template) before any filler is reused."""
    rng = random.Random(seed)
    passes: list[list[str]] = []
    for templates, fillers in FAMILIES.values():
        for filler in fillers:
            order = list(templates)
            rng.shuffle(order)
            for depth, template in enumerate(order):
                while len(passes) <= depth:
                    passes.append([])
                passes[depth].append(_fill(template, filler))
    prompts: list[str] = []
    for bucket in passes:
        rng.shuffle(bucket)
        prompts.extend(p for p in bucket if p not in prompts)
    if n > len(prompts):
        raise ValueError(f"only {len(prompts)} distinct prompts can be built, asked for {n}")
    return prompts[:n]


# -------------------------------------------------------------------------------------------- generation
SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")
DANGLING = re.compile(r"(?:\n[ \t]*(?:\d{1,2}[.)]|[-*•+#]+|\**)?[ \t]*)+$")  # empty trailing list items/markup


def assign_hints(n_prompts: int, k: int, seed: int) -> list[list[int]]:
    """For each prompt, ``k`` hint bitmasks, one style choice per axis drawn independently."""
    rng = random.Random(seed + 1)
    return [[sum(1 << h for choices, weights in AXES for h in rng.choices(choices, weights) if h is not None)
             for _ in range(k)] for _ in range(n_prompts)]


def hint_text(mask: int) -> str:
    """The style hints of a bitmask, as one string."""
    return " ".join(h for i, h in enumerate(HINTS) if mask >> i & 1)


def trim_cut(text: str, keep: float = 0.4) -> str:
    """A reply cut by the token limit, trimmed back to its last sentence end if that keeps enough of it."""
    ends = [m.end() for m in SENTENCE_END.finditer(text)]
    if ends and ends[-1] >= keep * len(text):
        return text[:ends[-1]].strip()
    return text.strip()


def strip_dangling(text: str) -> str:
    """The text without trailing empty list items ("4.") or markup lines (kept whole if nothing else is left)."""
    return DANGLING.sub("", "\n" + text).strip() or text


def tidy(text: str, finished: bool) -> str:
    """A generated reply: trimmed back to a sentence end when cut by the token limit, dangling items dropped."""
    return strip_dangling(text.strip() if finished else trim_cut(text))


def degenerate(text: str) -> bool:
    """A reply that is not text: under 3 words, mostly symbols/emoji (< 50% letters), or a 10-character run."""
    chars = [c for c in text if not c.isspace()]
    letters = sum(c.isalpha() for c in chars) / max(1, len(chars))
    return len(words(text)) < 3 or letters < 0.5 or re.search(r"(.)\1{9,}", text) is not None


def _messages(prompt: str, mask: int) -> list[dict]:
    """The chat sent to the model for one reply: the prompt, then its style hints."""
    return [{"role": "user", "content": f"{prompt} {hint_text(mask)}".strip()}]


def sample_batch(model, tok, chats: list[list[dict]], seed: int, args) -> list[str]:
    """Sampled replies for a batch of chats (left padded), trimmed when cut by max_new_tokens."""
    import torch

    enc = tok.apply_chat_template(chats, add_generation_prompt=True, padding=True, return_tensors="pt",
                                  return_dict=True)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, temperature=args.temperature, top_p=args.top_p,
                             max_new_tokens=args.max_new_tokens, pad_token_id=tok.pad_token_id)
    gen = out[:, enc["input_ids"].shape[1]:]
    finished = (gen == tok.eos_token_id).any(dim=1).tolist()
    texts = tok.batch_decode(gen, skip_special_tokens=True)
    return [tidy(t, done) for t, done in zip(texts, finished)]


def generate(args) -> None:
    """Sample the pool from the default model and write it as gzip JSON lines."""
    import torch
    from tqdm import tqdm

    from rlhf.config import AppConfig
    from rlhf.base_models import load_causal_lm, load_tokenizer, resolve_model

    torch.set_num_threads(args.threads)
    model_name = args.model or AppConfig().base_model
    source = resolve_model(model_name, args.data_dir or AppConfig().data_path, allow_hub=False)
    tok, model = load_tokenizer(source), load_causal_lm(source, "cpu")
    prompts = build_prompts(args.prompts, args.seed)
    hints = assign_hints(len(prompts), args.replies, args.seed)
    # Rows grouped by hints so short-style batches stop early; the order is fixed, so seeds are too.
    rows = sorted(((h, i, s) for i, hs in enumerate(hints) for s, h in enumerate(hs)))
    replies = [[""] * args.replies for _ in prompts]
    start = time.time()
    with tqdm(total=len(rows), desc="replies", unit="reply") as bar:
        for b in range(0, len(rows), args.batch_size):
            batch = rows[b:b + args.batch_size]
            texts = sample_batch(model, tok, [_messages(prompts[i], h) for h, i, _ in batch],
                                 args.seed * 100_000 + b, args)
            for (_, i, s), text in zip(batch, texts):
                replies[i][s] = text
            bar.update(len(batch))
    resampled = resample_degenerate(model, tok, prompts, hints, replies, args)
    meta = {"model": model_name, "source": Path(source).name, "seed": args.seed, "temperature": args.temperature,
            "top_p": args.top_p, "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
            "threads": args.threads, "hints": list(HINTS), "seconds": round(time.time() - start, 1),
            "hint_encoding": "bitmask over hints, appended to the user turn", "resampled": resampled,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m bench.preference_pool " + " ".join(sys.argv[1:])}
    records = [{"prompt_id": f"p{i:04d}", "prompt": p, "replies": replies[i], "hints": hints[i]}
               for i, p in enumerate(prompts)]
    write_pool(Path(args.out), meta, records)
    print(f"wrote {len(records)} prompts x {args.replies} replies to {args.out} "
          f"({Path(args.out).stat().st_size / 1e6:.2f} MB) in {meta['seconds']:.0f} s")


def resample_degenerate(model, tok, prompts: list[str], hints: list[list[int]], replies: list[list[str]], args,
                        attempts: int = 3) -> int:
    """Resample degenerate replies in place (new seeds, up to ``attempts`` rounds); how many were resampled."""
    total = 0
    for attempt in range(1, attempts + 1):
        rows = [(hints[i][s], i, s) for i in range(len(prompts)) for s in range(len(replies[i]))
                if degenerate(replies[i][s])]
        total += len(rows)
        for b in range(0, len(rows), args.batch_size):
            batch = rows[b:b + args.batch_size]
            texts = sample_batch(model, tok, [_messages(prompts[i], h) for h, i, _ in batch],
                                 args.seed * 100_000 + 90_000 + attempt * 1_000 + b, args)
            for (_, i, s), text in zip(batch, texts):
                replies[i][s] = text
    return total


def write_pool(path: Path, meta: dict, records: Sequence[dict]) -> None:
    """Gzip JSON lines: a meta header, then one line per prompt (temp file + atomic rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------ stats
def print_stats(pool: Sequence[dict]) -> None:
    """A table of preference_stats, with and without length-balanced pair picking."""
    train, held = split_prompts(pool)
    print(f"pool: {len(pool)} prompts x {len(pool[0]['replies'])} replies; split {len(train)} train / "
          f"{len(held)} held-out prompts; held-out pairs: at most 2 per prompt, seed {HELDOUT_SEED}")
    head = ("preference", "kind", "usable tr", "usable ho", "pairs tr", "pairs ho", "shorter", "len-acc",
            "raw shorter", "raw len-acc")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name in PREFERENCES:
        s, raw = preference_stats(pool, name), preference_stats(pool, name, balance=False)
        print(f"| {name} | {s['kind']} | {s['usable_train']} | {s['usable_heldout']} | {s['train_pairs']} | "
              f"{s['heldout_pairs']} | {s['chosen_shorter']:.2f} | {s['length_acc']:.2f} | "
              f"{raw['chosen_shorter']:.2f} | {raw['length_acc']:.2f} |")
    print_hint_means(pool)


def print_hint_means(pool: Sequence[dict]) -> None:
    """Mean score of replies with minus without each style hint, per preference (how learnable each one is)."""
    names = [n for n, p in PREFERENCES.items() if not p.flip]
    print("\nmean score with minus without each style hint, and mean words with it")
    rows = [(r["prompt"], rep, m) for r in pool for rep, m in zip(r["replies"], r["hints"])]
    for h, text in enumerate(HINTS):
        on = [(q, a) for q, a, m in rows if m >> h & 1]
        off = [(q, a) for q, a, m in rows if not m >> h & 1]
        if not on or not off:
            continue
        gaps = {n: _mean(PREFERENCES[n].score, on) - _mean(PREFERENCES[n].score, off) for n in names}
        words_on = sum(_word_count(a) for _, a in on) / len(on)
        print(f"  {text[:34]:34s} n={len(on):4d} words {words_on:5.1f} "
              + " ".join(f"{k} {v:+.2f}" for k, v in gaps.items()))


def _mean(score: Callable[[str, str], float], rows: Sequence[tuple[str, str]]) -> float:
    """Mean score over (prompt, reply) rows."""
    return sum(score(q, a) for q, a in rows) / len(rows)


# ------------------------------------------------------------------------------------------------- CLI
def main(argv: Optional[Sequence[str]] = None) -> None:
    """`generate` the pool or print its `stats`."""
    parser = argparse.ArgumentParser(prog="python -m bench.preference_pool", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="sample the pool from the default model")
    gen.add_argument("--out", default=str(POOL_PATH))
    gen.add_argument("--prompts", type=int, default=320)
    gen.add_argument("--replies", type=int, default=4)
    gen.add_argument("--batch-size", type=int, default=32)
    gen.add_argument("--max-new-tokens", type=int, default=96)
    gen.add_argument("--temperature", type=float, default=0.9)
    gen.add_argument("--top-p", type=float, default=0.95)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--threads", type=int, default=2,
                     help="torch threads; use 1 while other work runs (2 threads collapse ~10x under contention)")
    gen.add_argument("--model", default="", help="default: the app's base_model")
    gen.add_argument("--data-dir", default="", help="where the converted model is cached (default: the app's)")
    st = sub.add_parser("stats", help="usable pairs and length-only baselines per preference")
    st.add_argument("--pool", default=str(POOL_PATH))
    args = parser.parse_args(argv)
    if args.command == "generate":
        generate(args)
    else:
        print_stats(load_pool(args.pool))


if __name__ == "__main__":
    main()
