"""Model resolution: shipped GGUF → cached safetensors, local dirs, hub ids, clear errors."""
from __future__ import annotations

import pytest

from rlhf.base_models import ModelNotFound, cached_model_dir, resolve_model


def test_shipped_model_is_converted_once_and_cached(smol_dir, tmp_path):
    from tests.conftest import CACHE

    assert smol_dir == cached_model_dir("smollm2-135m-instruct", CACHE)
    assert (smol_dir / "config.json").is_file() and (smol_dir / "model.safetensors").is_file()
    stamp = (smol_dir / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("smollm2-135m-instruct", CACHE) == str(smol_dir)  # no second conversion
    assert (smol_dir / "model.safetensors").stat().st_mtime_ns == stamp
    assert not list(smol_dir.parent.glob(".smollm2-135m-instruct.*"))  # no temp dirs left behind


def test_local_directory_is_used_as_is(tiny_model_dir, tmp_path):
    assert resolve_model(str(tiny_model_dir), tmp_path) == str(tiny_model_dir)


def test_hub_id_passes_through_when_hub_allowed(tmp_path):
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct", tmp_path) == "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.mark.parametrize("name", ["no-such-model", "", "./missing-dir"])
def test_unknown_model_error_names_the_three_options(tmp_path, name):
    with pytest.raises(ModelNotFound) as info:
        resolve_model(name, tmp_path, allow_hub=False)
    text = str(info.value)
    assert "smollm2-135m-instruct" in text and "local directory" in text and "Hugging Face model id" in text


def test_directory_without_config_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFound, match="config.json"):
        resolve_model(str(tmp_path / "empty"), tmp_path)


# ---- the prompt fitter (issue #24, finding 8) -------------------------------------------------------------------
class CountingTokenizer:
    """The real tokenizer, counting how many messages it is asked to template (the fitter's cost)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.chat_template = tokenizer.chat_template
        self.calls = self.messages = 0

    def apply_chat_template(self, messages, **kwargs):
        self.calls += 1
        self.messages += len(messages)
        return self.tokenizer.apply_chat_template(messages, **kwargs)


def fit_by_dropping_one_pair_at_a_time(tokenizer, messages, max_tokens):
    """The fitter before: re-template the whole history after each drop (quadratic)."""
    system = [m for m in messages[:1] if m["role"] == "system"]
    turns = list(messages[len(system):])
    while True:
        ids = tokenizer.apply_chat_template(system + turns, add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"]
        if len(ids) <= max_tokens or len(turns) <= 1:
            return list(ids)[-max_tokens:]
        turns = turns[2:] if len(turns) > 2 else turns[-1:]


def history(n: int, seed: int = 0, system: bool = True) -> list[dict]:
    import random

    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "why?", "ok", "the", "model"]
    turns = [{"role": "user" if i % 2 == 0 else "assistant",
              "content": " ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))} for i in range(n)]
    return ([{"role": "system", "content": "Be brief."}] if system else []) + turns


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 7, 8, 25, 60])
def test_encode_prompt_keeps_what_dropping_pairs_kept(tokenizer, n):
    from rlhf.prompting import encode_prompt as fit_prompt

    for max_tokens in (8, 40, 120, 400, 4000):
        for system in (True, False) if n else (True,):
            messages = history(n, seed=n + max_tokens, system=system)
            assert fit_prompt(tokenizer, messages, max_tokens) == \
                fit_by_dropping_one_pair_at_a_time(tokenizer, messages, max_tokens), (n, max_tokens, system)


def test_encode_prompt_cost_does_not_grow_with_the_history(tokenizer):
    from rlhf.prompting import encode_prompt as fit_prompt

    many = [{"role": "system", "content": "Be brief."}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(9_999)]
    counting = CountingTokenizer(tokenizer)
    ids = fit_prompt(counting, many, 256)
    assert len(ids) <= 256 and tokenizer.decode(ids).rstrip().endswith("assistant")
    kept = fit_by_dropping_one_pair_at_a_time(tokenizer, [many[0]] + many[-81:], 256)  # the same tail, quickly
    assert ids == kept
    # The old fitter templated ~25 million messages here (9,999 + 9,997 + ... down to the kept window).
    assert counting.calls <= 2 * 14 + 2 and counting.messages <= 8 * 256, (counting.calls, counting.messages)
    short = CountingTokenizer(tokenizer)
    fit_prompt(short, many[:1] + many[-99:], 256)
    assert counting.messages <= 2 * short.messages + 256  # as cheap as a short history that keeps the same window


@pytest.mark.parametrize("name", ["\u0301" * 300, "x" * 5000, "a/" + "b" * 300, "ab/\u0301\u0301/cd"])
def test_a_name_no_file_system_can_hold_is_not_found_not_a_crash(tmp_path, name):
    """A few hundred bytes of combining characters (found by the REST fuzzer, issue 28): the path probe raised
    OSError "File name too long" and POST /agents answered 500. Nor is such a name a hub id."""
    with pytest.raises(ModelNotFound, match="cannot find base model"):
        resolve_model(name, tmp_path)
