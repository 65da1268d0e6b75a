"""The GGUF header reader gives the values gguf's own reader gives, steps over arrays, and refuses damage."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from rlhf.gguf_header import GGUFHeaderError, read_fields, read_header


@pytest.fixture
def small_gguf(tmp_path):
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i} ✓" for i in range(500)])  # a string array before the keys asked for
    w.add_token_scores([0.5] * 500)                         # a float array
    w.add_tokenizer_pre("smollm")
    w.add_file_type(7)
    w.add_bool("test.flag", True)
    w.add_float32("test.scale", 0.25)
    w.add_tensor("t", np.zeros((4, 4), dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((3, 8), dtype=np.float32))
    w.add_tensor("v", np.zeros(5, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_values_match_ggufs_own_reader(small_gguf):
    keys = ["tokenizer.ggml.pre", "general.file_type", "general.architecture", "test.flag", "test.scale"]
    ref = gguf.GGUFReader(str(small_gguf)).fields
    got = read_fields(small_gguf, keys + ["not.there"])
    assert got == {k: ref[k].contents() for k in keys}
    assert read_fields(small_gguf, ["tokenizer.ggml.tokens"]) == {"tokenizer.ggml.tokens": None}


def test_a_cut_file_or_another_format_is_a_clear_error(small_gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(small_gguf.read_bytes()[:600])  # inside the vocabulary
    with pytest.raises(GGUFHeaderError, match="cut short"):
        read_fields(cut, ["tokenizer.ggml.pre"])
    other = tmp_path / "x.gguf"
    other.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(GGUFHeaderError, match="not a GGUF"):
        read_fields(other, ["general.file_type"])


def test_tensor_shapes_match_ggufs_own_reader(small_gguf):
    ref = gguf.GGUFReader(str(small_gguf))
    fields, shapes = read_header(small_gguf, ["test.scale"])
    assert fields == {"test.scale": 0.25}
    assert shapes == {t.name: [int(x) for x in t.shape] for t in ref.tensors}
    assert shapes["blk.0.attn_q.weight"] == [8, 3] and shapes["v"] == [5]  # GGUF order: ne (innermost first)


@pytest.mark.slow  # reads the shipped model with gguf's own (slow) reader
def test_a_lora_conversion_reads_the_shipped_base_from_its_header():
    """BaseInfo (every engine start, every publish) from the header alone: the values gguf's own reader gives,
    without decoding the 49k-token vocabulary (7.7 s against 0.1 s on a 2-core machine)."""
    from rlhf.base_models import shipped_gguf
    from rlhf.serving.llama_cpp.convert import BaseInfo

    path = str(shipped_gguf("smollm2-135m-instruct"))
    info, ref = BaseInfo.read(path), gguf.GGUFReader(path)
    assert (info.arch, info.n_head, info.n_head_kv) == ("llama", ref.fields["llama.attention.head_count"].contents(),
                                                        ref.fields["llama.attention.head_count_kv"].contents())
    assert info.shapes == {t.name: [int(x) for x in t.shape] for t in ref.tensors}
