"""llama.cpp on the shipped GGUF, as a speed anchor for `bench serve` (run by the anchor venv's python).

Standalone on purpose: it runs in `.venv-anchors` (`make bench-anchors`), which has llama-cpp-python and nothing
of ours. It reads one JSON object on stdin::

    {"gguf": PATH, "threads": N, "max_tokens": 64, "prompts": [[token ids], ...], "levels": [1, 8],
     "per_user": 2, "ceiling": [1, 8]}

and prints one JSON object: per level, tokens/s, time to first token and the batch-1 decode rate, plus the greedy
token ids of each prompt (to compare with the app's replies), and with "ceiling" llama.cpp's own batched decode:
N sequences in every ``llama_decode`` call (its low-level API, greedy, no HTTP, no server), the most a serving
engine on this GGUF and these threads can decode. Prompts are token ids the app's tokenizer made from
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

    if spec.get("safe"):  # the weights as in the file: llama.cpp's AMX repack faults on some CPUs (STACK.md)
        bindings = llama_cpp.llama_cpp
        defaults = bindings.llama_model_default_params

        def safe_params():
            params = defaults()
            params.use_extra_bufts = False
            return params

        bindings.llama_model_default_params = safe_params
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
    ceiling = [batched_ceiling(llm, prompts, n, max_tokens) for n in spec.get("ceiling", [])]
    print(json.dumps({"version": llama_cpp.__version__, "load_s": load_s, "threads": spec["threads"],
                      "levels": levels, "greedy": greedy, "ceiling": ceiling}))
    return 0


def batched_ceiling(llm, prompts, n_seq: int, steps: int) -> dict:
    """``n_seq`` prompts prefilled, then ``steps`` greedy decode calls of ``n_seq`` tokens each on one context (a
    unified KV cache, as a serving engine shares one): decoded tokens per second of decode calls."""
    import llama_cpp as lib
    import numpy as np

    params = lib.llama_context_default_params()
    params.n_ctx = 4096
    params.n_batch = params.n_ubatch = 512
    params.n_seq_max = n_seq
    params.n_threads = params.n_threads_batch = llm.n_threads
    params.kv_unified = True
    ctx = lib.llama_init_from_model(llm.model, params)
    n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(llm.model))
    batch = lib.llama_batch_init(512, 0, 1)

    def fill(items):
        batch.n_tokens = len(items)
        for i, (token, pos, seq, logits) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, int(logits)
        assert lib.llama_decode(ctx, batch) == 0

    def argmax(i):
        return int(np.argmax(np.ctypeslib.as_array(lib.llama_get_logits_ith(ctx, i), shape=(n_vocab,))))

    seqs = [list(prompts[s % len(prompts)]) for s in range(n_seq)]
    nxt, pos = [], []
    for s, ids in enumerate(seqs):
        fill([(t, i, s, i == len(ids) - 1) for i, t in enumerate(ids)])
        nxt.append(argmax(len(ids) - 1))
        pos.append(len(ids))
    t0 = time.perf_counter()
    for _ in range(steps):
        fill([(nxt[s], pos[s], s, True) for s in range(n_seq)])
        nxt = [argmax(s) for s in range(n_seq)]
        pos = [p + 1 for p in pos]
    seconds = time.perf_counter() - t0
    lib.llama_batch_free(batch)
    lib.llama_free(ctx)
    return {"sequences": n_seq, "threads": llm.n_threads, "steps": steps, "tokens_per_s": n_seq * steps / seconds}


if __name__ == "__main__":
    sys.exit(main())
