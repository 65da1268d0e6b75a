"""Replies of a job's own peft model, generated through the serving seam (``rlhf.serving.interface``) by its torch
engine: every adapter's reply to every prompt in one continuous batch, the reply each row would get alone. The
retrain's evaluation compares versions with it; online DPO samples the replies it ranks with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from rlhf.prompting import encode_prompt


@dataclass
class Replies:
    """One adapter's replies to every prompt: text, generated token ids (EOS not included) and prompt ids."""

    texts: list
    token_ids: list
    prompt_ids: list
    sampled_by: str = "torch"  # what decoded them: the job's torch model, or a serving backend's name


def generate_replies(model, tokenizer, prompts: list[list[dict]], adapters: Sequence[Optional[str]],
                     max_new_tokens: int, temperature: float, seed: int, max_batch_size: int = 64,
                     max_prompt_tokens: Optional[int] = None,
                     on_reply: Optional[Callable[[int, int], None]] = None) -> list[Replies]:
    """Every adapter's (None = base) reply to every prompt, all decoded together by the serving engine.

    Prompts are fitted to ``max_prompt_tokens`` by ``rlhf.prompting.encode_prompt`` (the rule PPO's rollouts use).
    ``on_reply(done, total)`` hears each finished reply, for a progress bar.

    One continuous batch instead of one ``generate`` per adapter and chunk: rows of different adapters share
    each forward pass (peft mixed-adapter batches) and leave as they finish. Greedy at temperature 0; otherwise
    temperature -> top-k 50 -> top-p 1 sampling (HF ``generate``'s filters) with one generator per reply seeded
    ``seed + prompt index``, so a reply does not depend on what else shares the batch.
    """
    from rlhf.serving.interface import Request
    from rlhf.serving.policy_server import GenParams, ReplyStream, local_engine

    ids = [encode_prompt(tokenizer, p, max_prompt_tokens) for p in prompts]
    rows = [(a, i) for a in adapters for i in range(len(ids))]
    if not rows:
        return [Replies([], [], []) for _ in adapters]
    device = str(next(model.parameters()).device)
    # The torch engine of the serving seam: the adapters live on this job's peft model (training stays in torch).
    engine = local_engine(model, tokenizer, device, max_batch_size=max_batch_size, queue_size=len(rows),
                          batch_window_ms=0, max_prefill_tokens=max(1024, sum(map(len, ids))), start=False)
    streams = [ReplyStream(prompt_tokens=len(ids[i])) for _ in adapters for i in range(len(ids))]
    for (adapter, i), stream in zip(rows, streams):
        params = GenParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0, seed=seed + i)
        engine.submit(Request(ids[i], adapter, params, stream))
    engine.start()  # everything is queued: the first prefill takes all of it (up to max_batch_size)
    try:
        for done, stream in enumerate(streams, 1):
            stream.text()  # wait for the end (the stream's text holds back a last incomplete character)
            if on_reply is not None:
                on_reply(done, len(streams))
    finally:
        engine.close()
    texts = [tokenizer.decode(stream.token_ids, skip_special_tokens=True) for stream in streams]
    n = len(ids)
    return [Replies(texts[k * n:(k + 1) * n], [streams[k * n + i].token_ids for i in range(n)], ids)
            for k in range(len(adapters))]


def served_replies(server, tokenizer, prompts: list[list[dict]], adapter: Optional[str], max_new_tokens: int,
                   temperature: float, seed: int, max_prompt_tokens: Optional[int] = None, window: int = 32,
                   on_reply: Optional[Callable[[int, int], None]] = None) -> Replies:
    """Replies to every prompt from a ``PolicyServer`` (the engine people are served by: llama.cpp's batched decode
    on a CPU), with ``adapter`` (a version's dir, None = the base) loaded beside its base. Prompts are encoded by
    ``tokenizer`` (the job's, with its chat template) as ``generate_replies`` encodes them; at most ``window``
    replies are in the engine at once (its queue is bounded), each sampled with its own seed ``seed + index``."""
    from rlhf.serving.policy_server import AdapterRef, GenParams

    ids = [encode_prompt(tokenizer, p, max_prompt_tokens) for p in prompts]
    ref = AdapterRef(-1, adapter)  # an id no version has: the name the engine keys the adapter by
    streams: list = []
    for i, prompt in enumerate(ids):
        if i >= window:
            streams[i - window].text()  # the oldest in flight ends before another goes in
            if on_reply is not None:
                on_reply(i - window + 1, len(ids))
        params = GenParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0, seed=seed + i)
        streams.append(server.stream_ids(prompt, ref, params))
    for done, stream in enumerate(streams[max(0, len(ids) - window):], max(0, len(ids) - window) + 1):
        stream.text()
        if on_reply is not None:
            on_reply(done, len(ids))
    texts = [tokenizer.decode(stream.token_ids, skip_special_tokens=True) for stream in streams]
    return Replies(texts, [stream.token_ids for stream in streams], ids, server.engine_name)
