"""llama.cpp on the shipped GGUF, as a speed anchor for `bench serve` (run by the anchor venv's python).

Standalone on purpose: it runs in `.venv-anchors` (`make bench-anchors`), which has llama-cpp-python and nothing
of ours. It reads one JSON object on stdin::

    {"gguf": PATH, "threads": N, "max_tokens": 64, "prompts": [[token ids], ...], "levels": [1, 8],
     "per_user": 2}

and prints one JSON object: per level, tokens/s, time to first token and the batch-1 decode rate, plus the greedy
token ids of each prompt (to compare with the app's replies). Prompts are token ids the app's tokenizer made from
the same chat template, so both engines see identical inputs. llama-cpp-python's ``Llama`` decodes one sequence at
a time (its own server serialises requests behind a lock), so concurrent users queue here as they would there.
"""
from __future__ import annotations

import json
import sys
import threading
import time


def percentile(values, p):
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, -(-p * len(ordered) // 100) - 1)]


def generate(llm, prompt, max_tokens):
    """Greedy tokens for one prompt; (ids, seconds to first token, seconds from first to last token)."""
    eos = llm.token_eos()
    t0 = time.perf_counter()
    first = last = None
    out = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0, reset=True):
        now = time.perf_counter()
        if token == eos:
            break
        first = first if first is not None else now
        last = now
        out.append(int(token))
        if len(out) >= max_tokens:
            break
    return out, (first or time.perf_counter()) - t0, (last - first) if first is not None else 0.0


def main() -> int:
    spec = json.loads(sys.stdin.read())
    import llama_cpp
    from llama_cpp import Llama

    t0 = time.perf_counter()
    llm = Llama(model_path=spec["gguf"], n_threads=spec["threads"], n_threads_batch=spec["threads"], n_ctx=2048,
                verbose=False)
    load_s = time.perf_counter() - t0
    prompts, max_tokens = spec["prompts"], spec["max_tokens"]
    generate(llm, prompts[0], 4)  # warm-up
    greedy = [generate(llm, p, max_tokens)[0] for p in prompts]
    lock = threading.Lock()
    levels = []
    for users in spec["levels"]:
        ttfts, decode = [], []
        tokens = [0]

        def annotator(u):
            for k in range(spec["per_user"]):
                prompt = prompts[(u * spec["per_user"] + k) % len(prompts)]
                t_submit = time.perf_counter()
                with lock:  # one sequence at a time, as llama-cpp-python serves
                    waited = time.perf_counter() - t_submit
                    ids, ttft, dec_s = generate(llm, prompt, max_tokens)
                ttfts.append(waited + ttft)
                tokens[0] += len(ids)
                if len(ids) > 1 and dec_s > 0:
                    decode.append((len(ids) - 1) / dec_s)

        threads = [threading.Thread(target=annotator, args=(u,)) for u in range(users)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        levels.append({"users": users, "requests": users * spec["per_user"], "tokens": tokens[0], "wall_s": wall,
                       "tokens_per_s": tokens[0] / wall, "ttft_p50_s": percentile(ttfts, 50),
                       "ttft_p95_s": percentile(ttfts, 95),
                       "decode_tokens_per_s": sum(decode) / len(decode) if decode else 0.0})
    print(json.dumps({"version": llama_cpp.__version__, "load_s": load_s, "threads": spec["threads"],
                      "levels": levels, "greedy": greedy}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
