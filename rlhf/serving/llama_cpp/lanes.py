"""A lane: one llama.cpp context bound to one adapter (or the base), the replies decoding in it, and its cached
shared prefixes. Bookkeeping only; ``rlhf.serving.llama_cpp.engine`` runs the steps.

llama.cpp applies LoRA adapters per context, so replies of different versions decode in different contexts, all
on the one model (its weights are never copied). A lane whose last reply ended can be rebound to another
version; its KV cache is then cleared, because cached prefixes were computed with the old adapter.

KV cells are reserved at admission (prompt + ``max_new_tokens``, less a cached prefix), so a reply that was
admitted can always finish: a full lane makes new requests wait instead of failing running ones.
"""
from __future__ import annotations

import collections
import random
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from rlhf.serving.interface import TOP_K, IncrementalDecoder, Request
from rlhf.serving.llama_cpp.lib import Context, Lora


def sample_token(logits: np.ndarray, temperature: float, top_p: float, rng: Optional[np.random.Generator]) -> int:
    """Argmax at temperature 0; else temperature -> top-k (``TOP_K``) -> top-p, one draw from the row's own
    generator (the filters and order of HF ``generate``, as the transformers engine samples)."""
    if temperature <= 0 or rng is None:
        return int(np.argmax(logits))
    k = min(TOP_K, logits.shape[0])
    top = np.argpartition(logits, -k)[-k:]
    values = logits[top].astype(np.float64) / temperature
    order = np.argsort(-values, kind="stable")
    top, values = top[order], values[order]
    probs = np.exp(values - values[0])
    probs /= probs.sum()
    probs[(np.cumsum(probs) - probs) >= top_p] = 0.0  # keep a token while the mass before it is below top_p
    cdf = np.cumsum(probs)
    return int(top[min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), k - 1)])


def decode_order(lanes: list, rng: random.Random) -> list:
    """The busy lanes in the order one step decodes them, shuffled every step: lanes decode one after the other, so
    a fixed order would always let the same version's replies start (and run) first, and an arena round's pace
    would tell its two blind sides apart."""
    busy = [lane for lane in lanes if lane.seqs]
    rng.shuffle(busy)
    return busy


@dataclass
class Seq:
    """One reply in a lane: its llama.cpp sequence id, prompt tokens still to feed, position, and sampling state."""

    req: Request
    seq: int
    decoder: IncrementalDecoder
    rng: Optional[np.random.Generator]
    todo: list  # prompt tokens not yet fed
    pos: int  # position of the next token fed
    reserved: int  # KV cells reserved for it
    prefix_key: Optional[tuple] = None  # remember its prompt's first ids as a shared prefix once prefilled
    last: Optional[int] = None  # the sampled token to feed next
    generated: int = 0
    out: int = -1  # index of its logits in this step's batch (-1: none this step)
    started: float = field(default_factory=time.perf_counter)
    done: bool = False


class Lane:
    """One context and the replies decoding in it (see the module docstring)."""

    def __init__(self, ctx: Context, max_rows: int, max_prefixes: int):
        self.ctx = ctx
        self.adapter: Optional[str] = None
        self.lora: Optional[Lora] = None
        self.seqs: list[Seq] = []
        self.free_ids = list(range(max_rows))
        self.prefix_ids = list(range(max_rows, max_rows + max_prefixes))
        self.prefixes: collections.OrderedDict[tuple, int] = collections.OrderedDict()  # ids -> seq id, LRU
        self.reserved = 0

    @property
    def capacity(self) -> int:
        return self.ctx.n_ctx

    def bind(self, adapter: Optional[str], lora: Optional[Lora]) -> None:
        """Decode ``adapter``'s replies from now on (only while no reply runs here): the cache is emptied."""
        assert not self.seqs, "a lane is rebound only when idle"
        self.prefix_ids += list(self.prefixes.values())
        self.prefixes.clear()
        self.ctx.clear()
        self.reserved = 0
        self.ctx.set_lora(lora)
        self.adapter, self.lora = adapter, lora

    # ---- shared prefixes ------------------------------------------------------------------------
    def drop_prefix(self) -> bool:
        """Evict the least recently used prefix; False when there is none."""
        if not self.prefixes:
            return False
        key, seq = self.prefixes.popitem(last=False)
        self.ctx.seq_rm(seq)
        self.prefix_ids.append(seq)
        self.reserved -= len(key)
        return True

    def cached_prefix(self, key: Optional[tuple]) -> Optional[int]:
        if key is None or key not in self.prefixes:
            return None
        self.prefixes.move_to_end(key)
        return self.prefixes[key]

    def remember_prefix(self, seq: Seq) -> None:
        """After ``seq``'s prompt is in the cache: let a prefix sequence share its first cells (no copy)."""
        key = seq.prefix_key
        seq.prefix_key = None
        if key is None or key in self.prefixes:
            return
        if not self.prefix_ids and not self.drop_prefix():
            return
        pid = self.prefix_ids.pop()
        self.ctx.seq_cp(seq.seq, pid, 0, len(key))
        self.prefixes[key] = pid
        self.reserved += len(key)

    # ---- admission ------------------------------------------------------------------------------
    def fits(self, cells: int) -> bool:
        """Room for a reply reserving ``cells`` (evicting cached prefixes if that makes room)."""
        if not self.free_ids:
            return False
        while self.reserved + cells > self.capacity:
            if not self.drop_prefix():
                return False
        return True

    def admit(self, req: Request, tokenizer, prefix_key: Optional[tuple]) -> Seq:
        """Start ``req`` here (``fits`` said yes): reuse a cached prefix when there is one."""
        seq_id = self.free_ids.pop()
        rng = None
        if req.params.temperature > 0:
            seed = req.params.seed if req.params.seed is not None else int.from_bytes(np.random.bytes(8), "little")
            rng = np.random.default_rng(seed)
        ids = list(req.input_ids)
        shared = self.cached_prefix(prefix_key)
        start = 0
        if shared is not None:
            start = len(prefix_key)
            self.ctx.seq_cp(shared, seq_id, 0, start)
        reserved = len(ids) - start + int(req.params.max_new_tokens)
        seq = Seq(req, seq_id, IncrementalDecoder(tokenizer), rng, ids[start:], start, reserved,
                  prefix_key=None if shared is not None else prefix_key)
        self.seqs.append(seq)
        self.reserved += reserved
        return seq

    def release(self, seq: Seq) -> None:
        """Free a finished reply's sequence id and cells (cells a cached prefix shares stay)."""
        self.ctx.seq_rm(seq.seq)
        self.seqs.remove(seq)
        self.free_ids.append(seq.seq)
        self.reserved -= seq.reserved

    def reset(self) -> None:
        """Forget everything in the cache (after a failed decode); running replies must be finished first."""
        for seq in list(self.seqs):
            self.release(seq)
        while self.drop_prefix():
            pass
        self.ctx.clear()
        self.reserved = 0
