"""The transformers engine's pieces on their own: the incremental decoder, per-row sampling and the growing KV
cache layer (the engine that puts them together is tested in ``test_engine``)."""
from __future__ import annotations

import torch

from rlhf.serving.interface import IncrementalDecoder
from rlhf.serving.transformers.batch import GrowingLayer, sample_next


def test_incremental_decoder_rebuilds_the_full_text(tokenizer):
    text = "Héllo wörld! 🙂🚀 日本語のテキスト — done. " * 3
    ids = tokenizer(text)["input_ids"]
    dec = IncrementalDecoder(tokenizer)
    deltas = [dec.push(t) for t in ids]
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True) == dec.emitted
    assert not any("\ufffd" in d for d in deltas)
    assert sum(1 for d in deltas if d == "") > 0  # multi-token characters were held back, not split


def test_sample_next_greedy_top_p_and_private_generators():
    torch.manual_seed(0)
    logits = torch.randn(4, 1000)
    best = logits.argmax(-1).tolist()
    assert sample_next(logits, [0, 0, 0, 0], [1, 1, 1, 1], [None] * 4) == best
    # A tiny top_p keeps only the most likely token, whatever the temperature.
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    assert sample_next(logits, [1.5] * 4, [1e-6] * 4, gens) == best
    # Each row draws from its own generator: row 0's draws do not depend on the other rows.
    solo = [sample_next(logits[:1], [1.0], [0.95], [torch.Generator().manual_seed(7)])[0] for _ in range(2)]
    g = torch.Generator().manual_seed(7)
    mixed = sample_next(logits, [1.0, 0, 1.0, 1.0], [0.95] * 4, [g] + [torch.Generator().manual_seed(9)] * 3)
    assert solo[0] == solo[1] == mixed[0] and mixed[1] == best[1]
    # Only the top-50 can ever be drawn.
    top50 = set(torch.topk(logits[2], 50).indices.tolist())
    g = torch.Generator().manual_seed(1)
    draws = {sample_next(logits[2:3], [5.0], [1.0], [g])[0] for _ in range(200)}
    assert draws <= top50 and len(draws) > 10


def test_growing_layer_appends_like_concatenation():
    torch.manual_seed(0)
    keys, values = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    layer = GrowingLayer(keys, values, spare=2)
    for n in (1, 1, 3, 1, 70):  # outgrows its spare room twice
        k, v = torch.randn(2, 3, n, 4), torch.randn(2, 3, n, 4)
        keys, values = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
        got_k, got_v = layer.update(k, v)
        assert torch.equal(got_k, keys) and torch.equal(got_v, values)
    assert layer.get_seq_length() == keys.shape[2] and layer.get_mask_sizes(1)[0] == keys.shape[2] + 1
