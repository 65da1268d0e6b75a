"""Our PPO trainer end to end on tiny real models: learning, outputs, exact resume, guards, CLI, 2 processes."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from rlhf.assets import asset_path
from rlhf.config import ConfigError, load_config
from rlhf.training.ppo.trainer import PPOFailed, train_ppo
from rlhf.training.run_metrics import METRIC_KEYS, check_report_to, read_metrics
from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.slow  # trains or starts processes: not in `make test-fast`

PROMPTS = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Tell me about {w}."}]
           for w in ("cats", "dogs", "rain", "tea", "music", "trees", "code", "maths")]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread; two threads on a shared 2-core machine mostly wait on each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def ppo_config(tmp_path, model_dir, *overrides):
    """These tests measure PPO against a synthetic reward, so the default shaping terms (relevance, novelty,
    repetition: tested on their own in test_shaping.py and below) are off unless a test turns one on."""
    return load_config(env={}, overrides=[
        "ppo.relevance_weight=0", "ppo.novelty_weight=0", "ppo.repetition_weight=0",
        f"data_dir={tmp_path / 'data'}", f"base_model={model_dir}", "device=cpu", "ppo.batch_size=2",
        "ppo.group_size=2", "ppo.mini_batch_size=2", "ppo.max_new_tokens=6", "ppo.eval_prompts=2",
        "ppo.save_every=0", "ppo.voice_check_tokens=0", *overrides])


def reply_length(prompts, replies):
    """A cheap synthetic reward: longer replies score higher."""
    return [len(r) / 20 for r in replies]


def adapter_tensors(adapter_dir):
    from safetensors.torch import load_file

    return load_file(str(adapter_dir / "adapter_model.safetensors"))


# ---------------------------------------------------------------- learning


def untied_llama(tokenizer):
    """A tiny random Llama (seed 0) with its own output layer, for a test to plant something in."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))


def saved(model, tokenizer, target):
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


@pytest.fixture(scope="module")
def planted(tmp_path_factory, tokenizer):
    """A tiny random Llama whose output layer has a planted direction u: the tokens whose output rows point
    along u form half the vocabulary, and a LoRA policy can favour them all by steering its hidden state."""
    model = untied_llama(tokenizer)
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.5)
        u = torch.randn(64)
        favoured = set(torch.nonzero(model.lm_head.weight @ u > 0).flatten().tolist())
    return saved(model, tokenizer, tmp_path_factory.mktemp("planted")), favoured


@pytest.mark.parametrize("threads", [1, 2])
def test_ppo_raises_a_synthetic_reward_while_kl_stays_bounded(tmp_path, planted, tokenizer, threads):
    """Deterministic: fixed seeds and a fixed thread count (float sums differ across thread counts), with a
    margin that holds on either count."""
    model_dir, favoured = planted
    before = torch.get_num_threads()
    torch.set_num_threads(threads)

    def share_favoured(prompts, replies):  # reward = share of reply tokens from the favoured half
        ids = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in replies]
        return [sum(i in favoured for i in x) / max(len(x), 1) for x in ids]

    config = ppo_config(tmp_path, model_dir, "ppo.steps=10", "ppo.batch_size=8", "ppo.group_size=1", "ppo.advantage=gae",
                        "ppo.mini_batch_size=4",
                        "ppo.max_new_tokens=8", "ppo.learning_rate=1e-3", "ppo.kl_init=0.02", "ppo.ppo_epochs=2")
    try:
        result = train_ppo(config, str(model_dir), share_favoured, PROMPTS, PROMPTS, tmp_path / "run")
    finally:
        torch.set_num_threads(before)
    rewards = [m["reward/mean"] for m in result.history]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.1, rewards
    assert result.reward_after > result.reward_before
    kls = [m["ppo/kl"] for m in result.history]
    assert all(math.isfinite(k) and k < config.ppo.kl_limit for k in kls), kls
    assert 0 < result.kl < config.ppo.kl_limit
    assert all(math.isfinite(m["loss/policy"]) and math.isfinite(m["loss/value"]) for m in result.history)


def test_group_baselines_raise_the_reward_without_a_value_head(tmp_path, planted, tokenizer):
    """ppo.group_size > 1: each prompt sampled 4 times, advantages against the prompt's other replies (RLOO);
    the value head is neither trained nor needed."""
    model_dir, favoured = planted

    def share_favoured(prompts, replies):
        ids = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in replies]
        return [sum(i in favoured for i in x) / max(len(x), 1) for x in ids]

    config = ppo_config(tmp_path, model_dir, "ppo.steps=8", "ppo.batch_size=2", "ppo.group_size=4",
                        "ppo.mini_batch_size=4", "ppo.max_new_tokens=8", "ppo.learning_rate=1e-3",
                        "ppo.kl_init=0.02", "ppo.ppo_epochs=2")
    result = train_ppo(config, str(model_dir), share_favoured, PROMPTS, PROMPTS, tmp_path / "run")
    rewards = [m["reward/mean"] for m in result.history]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1, rewards
    assert result.reward_after > result.reward_before
    assert all(m["loss/value"] == 0.0 and m["ppo/minibatches"] > 0 for m in result.history)
    assert all(0 < m["voice/distinct2"] <= 1 for m in result.history)  # the rollouts' variety, logged each step
    assert 0 < result.kl < config.ppo.kl_limit
    with pytest.raises(ConfigError, match="ppo.mini_batch_size must be in 1..ppo.batch_size \\* ppo.group_size"):
        ppo_config(tmp_path, model_dir, "ppo.batch_size=2", "ppo.group_size=2", "ppo.mini_batch_size=5")


# ---------------------------------------------------------------- outputs of a run


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("ppo-run")
    config = ppo_config(tmp, tiny_model_dir, "ppo.steps=2", "ppo.save_every=1", "ppo.eval_every=1")
    steps = []
    result = train_ppo(config, str(tiny_model_dir), reply_length, PROMPTS, PROMPTS[:2], tmp / "run",
                       on_step=lambda step, metrics: steps.append((step, dict(metrics))))
    return config, result, steps


def test_run_writes_final_best_checkpoints_metrics_and_config(finished_run):
    config, result, steps = finished_run
    run = result.run_dir
    assert result.final_dir == run / "final" / "adapter" and result.best_dir == run / "best" / "adapter"
    for d in (run / "final", run / "best", run / "checkpoints" / "step-000001", run / "checkpoints" / "step-000002"):
        assert (d / "adapter" / "adapter_config.json").is_file() and (d / "value_head.pt").is_file()
    assert {p.name for p in (run / "checkpoints" / "step-000001").iterdir()} == {
        "adapter", "value_head.pt", "optimizer.pt", "rng.pt", "trainer_state.json"}
    assert not [p for p in run.rglob("*") if ".tmp-" in p.name or ".old-" in p.name]  # no temp dirs left
    assert json.loads((run / "config.json").read_text())["ppo"]["steps"] == 2
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2] and set(METRIC_KEYS) <= set(rows[0])
    assert rows[0]["eval/reward"] is not None  # eval_every=1 evaluates every step but the last
    assert [s for s, _ in steps] == [1, 2] and steps[1][1]["ppo/kl_coef"] > 0
    assert all(math.isfinite(steps[0][1][k]) for k in METRIC_KEYS if not k.startswith("eval/"))
    summary = result.summary()
    assert set(summary) == {"run_dir", "steps", "reward_before", "reward_after", "kl", "seconds", "phase_seconds"}
    assert set(summary["phase_seconds"]) == {"generate", "score", "reference", "update", "eval"}
    assert len(result.eval_samples) == 2 and {"prompt", "reply", "reward"} <= set(result.eval_samples[0])


def test_the_final_adapter_is_trained_and_servable(finished_run, tiny_server):
    from rlhf.serving.policy_server import AdapterRef

    _, result, _ = finished_run
    lora_b = [t for k, t in adapter_tensors(result.final_dir).items() if "lora_B" in k]
    assert lora_b and any(t.abs().max() > 0 for t in lora_b)  # LoRA B starts at zero: the update moved it
    tiny_server.ensure_adapter(AdapterRef(99, str(result.final_dir)))


def test_resume_continues_exactly(tmp_path, tiny_model_dir):
    config = ppo_config(tmp_path, tiny_model_dir, "ppo.steps=3", "ppo.save_every=1")
    straight = train_ppo(config, str(tiny_model_dir), reply_length, PROMPTS, PROMPTS[:2], tmp_path / "a")

    def cancel_at_two(step, metrics):
        if step == 2:  # step 2 ran and was checkpointed; its metrics row must not be written twice
            raise KeyboardInterrupt("cancelled")

    with pytest.raises(KeyboardInterrupt):
        train_ppo(config, str(tiny_model_dir), reply_length, PROMPTS, PROMPTS[:2], tmp_path / "b",
                  on_step=cancel_at_two)
    assert not (tmp_path / "b" / "final").exists()
    resumed = train_ppo(config, str(tiny_model_dir), reply_length, PROMPTS, PROMPTS[:2], tmp_path / "b",
                        resume=tmp_path / "b" / "checkpoints" / "step-000001")
    assert [r["step"] for r in read_metrics(tmp_path / "b")] == [1, 2, 3]
    for key in ("reward/mean", "ppo/kl", "loss/policy", "loss/value"):
        assert_close(torch.tensor([m[key] for m in resumed.history]),
                     torch.tensor([m[key] for m in straight.history]))
    a, b = adapter_tensors(straight.final_dir), adapter_tensors(resumed.final_dir)
    assert a.keys() == b.keys()
    for key in a:
        assert_close(a[key], b[key])
    assert resumed.reward_after == pytest.approx(straight.reward_after)


@pytest.fixture(scope="module")
def few_words(tmp_path_factory, tokenizer):
    """A tiny random Llama that writes only six words, so its replies share word pairs and repeat 3-grams (a
    random model over the whole vocabulary never does, and the voice watch would have nothing to see)."""
    model = untied_llama(tokenizer)
    ids = [tokenizer(f" {w}", add_special_tokens=False)["input_ids"][0]
           for w in ("cat", "dog", "tea", "rain", "sun", "sky")]
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.01)
        model.lm_head.weight[ids] = torch.randn(len(ids), 64) * 2
    return saved(model, tokenizer, tmp_path_factory.mktemp("few-words"))


def test_the_voice_watch_stops_a_drifting_run_on_the_weights_it_vouched_for(tmp_path, few_words):
    """Thresholds so small that the first step whose rollouts repeat more or vary less than step 1's stops the run
    (deterministic: fixed seeds, one thread). Up to the stop the run is the unwatched run on the same seeds, so the
    weights it keeps are that run's checkpoint of the step it names."""
    common = ("ppo.steps=4", "ppo.save_every=1", "ppo.max_new_tokens=12")
    free = train_ppo(ppo_config(tmp_path, few_words, *common, "ppo.stop_repetition_rise=0"), str(few_words),
                     reply_length, PROMPTS, PROMPTS[:2], tmp_path / "free")
    assert free.voice_stop is None and len(free.history) == 4
    config = ppo_config(tmp_path, few_words, *common, "ppo.stop_repetition_rise=1e-9",
                        "ppo.stop_distinct_drop=1e-9", "ppo.stop_window=1")
    watched = train_ppo(config, str(few_words), reply_length, PROMPTS, PROMPTS[:2], tmp_path / "watched")
    stop = watched.voice_stop
    assert stop is not None and 2 <= stop["step"] <= 4 and stop["kept"] == stop["step"] - 2
    assert "ppo.stop_" in stop["reason"]
    assert watched.steps == len(watched.history) == stop["step"]
    assert [m["voice/distinct2"] for m in watched.history] == [m["voice/distinct2"] for m in free.history][:stop["step"]]
    kept = adapter_tensors(tmp_path / "free" / "checkpoints" / f"step-{stop['kept']:06d}" / "adapter")
    final = adapter_tensors(watched.final_dir)
    assert kept.keys() == final.keys()
    for key in kept:
        assert_close(final[key], kept[key])
    info = json.loads((watched.run_dir / "final" / "info.json").read_text())
    assert info["voice_stop"] == stop and info["step"] == stop["step"] and stop["of"] == 4
    from rlhf.training.methods import get_method
    recorded = get_method("ppo").result_metrics(watched, 0)  # what the published version's metrics keep
    assert [recorded[f"voice_watch/{k}"] for k in ("step", "kept", "of")] == [stop["step"], stop["kept"], 4]


def test_the_voice_check_samples_the_start_and_end_without_touching_training(tmp_path, few_words):
    """Gate thresholds so small that any loss of variety or rise in repetition counts. The check samples the start
    and the end on the eval prompts without touching training, so the checked run trains as the unchecked one on
    the same seeds. The six-word model's replies loop more from the first step on (distinct-2 0.033 -> 0.022 on
    these prompts), so no checkpoint passes and, without blends (the test below), the final weights stay;
    test_voice_check.py has the way back."""
    common = ("ppo.steps=4", "ppo.save_every=1", "ppo.max_new_tokens=12", "ppo.eval_prompts=4")
    free = train_ppo(ppo_config(tmp_path, few_words, *common), str(few_words), reply_length, PROMPTS, PROMPTS[:4],
                     tmp_path / "free")
    config = ppo_config(tmp_path, few_words, *common, "ppo.voice_check_tokens=24", "ppo.voice_check_blends=0",
                        "gate.max_distinct_drop=1e-9", "gate.max_repetition_ratio=1", "gate.max_repetition_rise=0")
    checked = train_ppo(config, str(few_words), reply_length, PROMPTS, PROMPTS[:4], tmp_path / "checked")
    assert [m["voice/distinct2"] for m in checked.history] == [m["voice/distinct2"] for m in free.history]
    start = json.loads((tmp_path / "checked" / "checkpoints" / "step-000001" / "trainer_state.json").read_text())
    assert {view: set(voice) for view, voice in start["voice_start"].items()} == {
        view: {"distinct_2", "repetition", "words"} for view in ("sampled", "gate")}
    stop = checked.voice_stop
    assert stop is not None and stop["by"] == "check" and stop["step"] == 4 and stop["of"] == 4
    assert stop["kept"] == 4 and "gate.max_distinct_drop" in stop["reason"]
    kept, final = adapter_tensors(free.final_dir), adapter_tensors(checked.final_dir)
    assert kept.keys() == final.keys()
    for key in kept:
        assert_close(final[key], kept[key])
    from rlhf.training.methods import get_method
    recorded = get_method("ppo").result_metrics(checked, 0)
    assert recorded["voice_watch/by"] == "check" and recorded["voice_watch/kept"] == stop["kept"]


def test_the_voice_checks_blend_keeps_the_voice_where_no_checkpoint_does(tmp_path, few_words):
    """``ppo.voice_check_blends`` on a real run, with the gate thresholds of the test above, where no checkpoint
    keeps the voice: the starting weights are saved in ``run_dir/start`` (a fresh adapter: LoRA's B at zero), and
    half of the final weights' change passes in every view, so it is kept: each published tensor is the unchecked
    run's final one blended half way with the start. The training itself is the unchecked run's."""
    common = ("ppo.steps=4", "ppo.save_every=1", "ppo.max_new_tokens=12", "ppo.eval_prompts=4")
    free = train_ppo(ppo_config(tmp_path, few_words, *common), str(few_words), reply_length, PROMPTS, PROMPTS[:4],
                     tmp_path / "free")
    config = ppo_config(tmp_path, few_words, *common, "ppo.voice_check_tokens=24", "ppo.voice_check_blends=2",
                        "gate.max_distinct_drop=1e-9", "gate.max_repetition_ratio=1", "gate.max_repetition_rise=0")
    checked = train_ppo(config, str(few_words), reply_length, PROMPTS, PROMPTS[:4], tmp_path / "checked")
    assert [m["voice/distinct2"] for m in checked.history] == [m["voice/distinct2"] for m in free.history]
    start = adapter_tensors(tmp_path / "checked" / "start" / "adapter")
    assert any("lora_B" in k for k in start) and all(torch.count_nonzero(w) == 0 for k, w in start.items()
                                                     if "lora_B" in k)
    stop = checked.voice_stop
    assert (stop["step"], stop["kept"], stop["blend"], stop["passes"]) == (4, 4, 0.5, "every view")
    unchecked, published = adapter_tensors(free.final_dir), adapter_tensors(checked.final_dir)
    assert unchecked.keys() == published.keys() == start.keys()
    for key in unchecked:
        assert_close(published[key], start[key] + 0.5 * (unchecked[key] - start[key]))
    from rlhf.training.methods import get_method
    assert get_method("ppo").result_metrics(checked, 0)["voice_watch/blend"] == 0.5


def test_each_loss_the_voice_probe_finds_raises_the_kl_coefficient(tmp_path, few_words):
    """Gate thresholds so small that any loss of variety or rise in repetition counts, probed after every step
    (deterministic: fixed seeds, one thread), on votes for a loop: each step whose weights lost the voice multiplies
    the (fixed) KL coefficient the next step pays by ppo.voice_probe_kl; the vote steps go on."""
    pairs = [{"prompt": p, "chosen": "cat cat cat cat cat cat cat cat", "rejected": "dog tea rain sun sky"}
             for p in PROMPTS[:4]]
    common = ("ppo.steps=4", "ppo.max_new_tokens=12", "ppo.eval_prompts=4", "ppo.voice_check_tokens=24",
              "ppo.vote_passes=0", "ppo.kl_limit=1e6", "ppo.kl_target=0", "ppo.kl_init=0.05")
    config = ppo_config(tmp_path, few_words, *common, "ppo.voice_probe_every=1", "ppo.voice_probe_kl=3",
                        "gate.max_distinct_drop=1e-9", "gate.max_repetition_ratio=1", "gate.max_repetition_rise=0")
    run = train_ppo(config, str(few_words), reply_length, PROMPTS, PROMPTS[:4], tmp_path / "probed", pairs=pairs)
    probe, history = run.voice_probe, run.history
    assert probe is not None and "gate.max_distinct_drop" in probe["reason"] and probe["losses"] >= 1
    lost = [m["voice_probe/passed"] == 0.0 for m in history]
    assert lost.index(True) + 1 == probe["step"] and sum(lost) == probe["losses"]
    assert [m["ppo/kl_coef"] for m in history] == pytest.approx([0.05 * 3 ** sum(lost[:i]) for i in range(4)])
    assert probe["kl_coef"] == pytest.approx(0.05 * 3 ** probe["losses"])
    assert all("votes/loss" in m for m in history)
    unprobed = train_ppo(ppo_config(tmp_path, few_words, *common), str(few_words), reply_length, PROMPTS,
                         PROMPTS[:4], tmp_path / "unprobed", pairs=pairs)
    # up to the first loss the probed run is the unprobed one: the probe reads the weights and changes nothing
    assert [m["reward/mean"] for m in history][:probe["step"]] == \
        [m["reward/mean"] for m in unprobed.history][:probe["step"]]
    from rlhf.training.methods import get_method
    recorded = get_method("ppo").result_metrics(run, len(pairs))
    assert recorded["voice_probe/step"] == probe["step"] and recorded["voice_probe/losses"] == probe["losses"]


# ---------------------------------------------------------------- guards


def test_nan_rewards_fail_the_run_with_a_reason_and_publish_nothing(tmp_path, tiny_model_dir):
    config = ppo_config(tmp_path, tiny_model_dir, "ppo.steps=3", "ppo.max_guard_events=3", "ppo.save_every=1")
    with pytest.raises(PPOFailed, match="non-finite reward"):
        train_ppo(config, str(tiny_model_dir), lambda p, r: [math.nan] * len(r), PROMPTS, PROMPTS[:2],
                  tmp_path / "run")
    assert not (tmp_path / "run" / "final").exists() and not (tmp_path / "run" / "best").exists()
    assert "non-finite reward" in json.loads((tmp_path / "run" / "failed.json").read_text())["reason"]


def test_one_nan_reward_is_skipped_and_counted(tmp_path, tiny_model_dir):
    calls = []

    def flaky(prompts, replies):
        calls.append(len(replies))
        scores = reply_length(prompts, replies)
        if len(calls) == 2:  # call 1 is the evaluation before training; call 2 is step 1's rollout
            scores[0] = math.nan
        return scores

    config = ppo_config(tmp_path, tiny_model_dir, "ppo.steps=2")
    result = train_ppo(config, str(tiny_model_dir), flaky, PROMPTS, PROMPTS[:2], tmp_path / "run")
    assert result.guard_events == 1 and result.history[0]["guard/events"] == 1
    assert all(math.isfinite(m["reward/mean"]) and math.isfinite(m["loss/policy"]) for m in result.history)
    assert (result.final_dir / "adapter_config.json").is_file()


def test_a_kl_above_the_hard_limit_skips_minibatches_until_the_run_fails(tmp_path, tiny_model_dir):
    # A huge learning rate drives the policy away from the base; a tiny hard limit then trips the guard.
    config = ppo_config(tmp_path, tiny_model_dir, "ppo.steps=6", "ppo.learning_rate=0.5", "ppo.kl_limit=0.01",
                        "ppo.max_guard_events=2", "ppo.ratio_limit=1e9", "ppo.approx_kl_stop=1e9")
    with pytest.raises(PPOFailed, match="ppo.kl_limit|ppo.ratio_limit|non-finite"):
        train_ppo(config, str(tiny_model_dir), reply_length, PROMPTS, PROMPTS[:2], tmp_path / "run")
    assert not (tmp_path / "run" / "final").exists()


def test_metrics_are_mirrored_through_accelerate_trackers(tmp_path, tiny_model_dir, monkeypatch):
    from accelerate.tracking import GeneralTracker

    class Recorder(GeneralTracker):
        name, requires_logging_directory = "recorder", False

        def __init__(self):
            super().__init__()
            self.config, self.steps, self.finished = None, [], False

        @property
        def tracker(self):
            return self

        def store_init_configuration(self, values):
            self.config = values

        def log(self, values, step=None, **kwargs):
            self.steps.append((step, values))

        def finish(self):
            self.finished = True

    recorder = Recorder()
    monkeypatch.setattr("rlhf.training.ppo.trainer.tracker_for", lambda name: [recorder])
    config = ppo_config(tmp_path, tiny_model_dir, "ppo.steps=2")
    train_ppo(config, str(tiny_model_dir), reply_length, PROMPTS, PROMPTS[:2], tmp_path / "run")
    assert recorder.config["ppo.steps"] == 2 and recorder.finished
    assert [step for step, _ in recorder.steps] == [1, 2]
    csv_rows = read_metrics(tmp_path / "run")
    assert recorder.steps[1][1]["reward/mean"] == pytest.approx(csv_rows[1]["reward/mean"])


def test_report_to_needs_a_known_and_installed_tracker():
    with pytest.raises(ConfigError, match="must be one of"):
        check_report_to("mlflow")
    check_report_to("none")
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        with pytest.raises(ConfigError, match="pip install wandb"):
            check_report_to("wandb")


# ---------------------------------------------------------------- command line


def cli_args(tmp_path, model_dir, *extra):
    return ["train-ppo", "--reward-model", "none", "--set", f"data_dir={tmp_path / 'data'}",
            "--set", f"base_model={model_dir}", "--set", "device=cpu", "--set", "ppo.polite_weight=1.0",
            "--set", "ppo.length_target=4", "--set", "ppo.length_weight=1.0", "--set", "ppo.steps=1",
            "--set", "ppo.batch_size=2", "--set", "ppo.mini_batch_size=2", "--set", "ppo.max_new_tokens=4",
            "--set", "ppo.eval_prompts=2", "--set", "ppo.save_every=1", *extra]


def test_cli_trains_prints_one_json_line_last_and_resumes(tmp_path, tiny_model_dir, capsys):
    from cli import main
    from storage import Store

    (tmp_path / "data").mkdir()
    store = Store(tmp_path / "data" / "studio.db")
    store.ensure_default_agent(str(tiny_model_dir))
    store.close()
    assert main(cli_args(tmp_path, tiny_model_dir)) == 0
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    assert summary["steps"] == 1 and set(summary["phase_seconds"]) >= {"generate", "score", "reference", "update"}
    run_dir = summary["run_dir"]
    assert run_dir.startswith(str(tmp_path / "data" / "runs"))
    assert main(cli_args(tmp_path, tiny_model_dir, "--resume", run_dir, "--set", "ppo.steps=2")) == 0
    resumed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert resumed["run_dir"] == run_dir and resumed["steps"] == 2
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]


def test_cli_without_a_reward_model_says_what_to_do(tmp_path, tiny_model_dir, capsys):
    from cli import main

    args = [a for a in cli_args(tmp_path, tiny_model_dir) if a not in ("--reward-model", "none")]
    assert main(args) == 2
    assert "no reward model yet" in capsys.readouterr().err
    assert main(cli_args(tmp_path, tiny_model_dir, "--agent", "nobody")) == 2
    assert "unknown agent 'nobody'" in capsys.readouterr().err
    assert not (tmp_path / "data" / "runs").exists()


def test_the_core_run_raises_and_reports_through_callbacks(tmp_path, tiny_model_dir, capsys):
    """``run_ppo`` (the core of `train-ppo`) prints nothing: a missing input is an exception, progress goes to
    ``on_start`` / ``on_step``, and the result comes back."""
    from rlhf.training.ppo.run import PPOInputError, run_ppo

    config = load_config(None, cli_args(tmp_path, tiny_model_dir)[4::2], env={})
    with pytest.raises(PPOInputError, match="unknown agent 'nobody'"):
        run_ppo(config, "nobody", "none")
    assert capsys.readouterr() == ("", "")
    events = []
    result = run_ppo(config, None, "none", on_start=lambda steps, main: events.append(("start", steps, main)),
                     on_step=lambda step, metrics: events.append(("step", step, "reward/mean" in metrics)))
    assert result.summary()["steps"] == 1 and events == [("start", 1, True), ("step", 1, True)]


def test_two_process_accelerate_run(tmp_path, tiny_model_dir):
    accelerate = ROOT / ".venv" / "bin" / "accelerate"
    if not accelerate.exists():
        accelerate = "accelerate"
    cmd = [str(accelerate), "launch", "--config_file", str(asset_path("accelerate_cpu2.yaml")),
           "--main_process_port", str(free_port()), "-m", "cli", *cli_args(tmp_path, tiny_model_dir)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PATH": f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin", "OMP_NUM_THREADS": "1",
                               "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, proc.stdout  # only the main process reports
    summary = json.loads(lines[0])
    assert summary["steps"] == 1
    assert json.loads((Path(summary["run_dir"]) / "final" / "info.json").read_text())["processes"] == 2
    rows = read_metrics(summary["run_dir"])
    assert len(rows) == 1 and rows[0]["ppo/response_length"] > 0
    assert [p.name for p in (tmp_path / "data" / "runs").iterdir()] == [Path(summary["run_dir"]).name]


def test_python_dash_m_entry_point_lists_train_ppo():
    out = subprocess.run([sys.executable, "-m", "cli", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert "train-ppo" in out.stdout


# ---------------------------------------------------------------- CUDA (skipped without a GPU)


@pytest.fixture
def fresh_accelerate_state():
    """Accelerate pins a process to the first device it is asked for: start and leave this test clean."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.gpu
@pytest.mark.parametrize("four_bit", [False, True])
def test_one_step_on_cuda_bf16_and_qlora(tmp_path, tiny_model_dir, four_bit, fresh_accelerate_state):
    config = ppo_config(tmp_path, tiny_model_dir, "ppo.steps=1", "device=cuda", f"ppo.load_in_4bit={four_bit}")
    result = train_ppo(config, str(tiny_model_dir), reply_length, PROMPTS, PROMPTS[:2], tmp_path / "run",
                       device="cuda")
    assert math.isfinite(result.history[0]["loss/policy"]) and result.final_dir.is_dir()
    assert json.loads((result.final_dir.parent / "info.json").read_text())["device"].startswith("cuda")
    lora_b = [t for k, t in adapter_tensors(result.final_dir).items() if "lora_B" in k]
    assert any(t.abs().max() > 0 for t in lora_b)


def test_relevance_weight_pays_each_reply_its_relevance_to_its_prompt(tmp_path, tiny_model_dir):
    """ppo.relevance_weight: the reference model's log-prob gain of a reply after its own prompt over another
    prompt of the batch (logged as voice/relevance) costs each reply whatever it falls short of the floor (the part
    reward/relevance). A floor above every reply's relevance makes the cost linear: weight x (relevance - floor)."""
    config = ppo_config(tmp_path, tiny_model_dir, "ppo.steps=2", "ppo.relevance_weight=2.0",
                        "ppo.relevance_floor=10", "ppo.reward_clip=0")
    result = train_ppo(config, str(tiny_model_dir), reply_length, PROMPTS, PROMPTS[:2], tmp_path / "run")
    for m in result.history:
        assert math.isfinite(m["voice/relevance"]) and m["voice/relevance"] != 0, m
        assert m["reward/relevance"] == pytest.approx(2.0 * (m["voice/relevance"] - 10), rel=1e-6)
        assert m["reward/mean"] == pytest.approx(m["reward/rm"] + m["reward/relevance"], rel=1e-5, abs=1e-6)
    plain = train_ppo(ppo_config(tmp_path, tiny_model_dir, "ppo.steps=1"), str(tiny_model_dir), reply_length,
                      PROMPTS, PROMPTS[:2], tmp_path / "plain")
    assert "voice/relevance" not in plain.history[0] and "reward/relevance" not in plain.history[0]


def test_the_default_reward_pays_for_the_voice(tmp_path, tiny_model_dir):
    """The default config (#40) shapes PPO's reward with the three terms that keep the voice: relevance below the
    floor, word pairs shared with replies to other prompts, and repeated 3-grams; the total is the reward model's
    score plus those parts."""
    config = load_config(env={}, overrides=[
        f"data_dir={tmp_path / 'data'}", f"base_model={tiny_model_dir}", "device=cpu", "ppo.batch_size=2",
        "ppo.group_size=2", "ppo.mini_batch_size=2", "ppo.max_new_tokens=6", "ppo.save_every=0", "ppo.steps=1",
        "ppo.reward_clip=0"])
    result = train_ppo(config, str(tiny_model_dir), reply_length, PROMPTS, PROMPTS[:2], tmp_path / "run")
    m = result.history[0]
    terms = ["reward/relevance", "reward/novelty", "reward/repetition"]
    assert all(math.isfinite(m[t]) and m[t] <= 0 for t in terms), m
    assert m["reward/mean"] == pytest.approx(m["reward/rm"] + sum(m[t] for t in terms), rel=1e-5, abs=1e-6)
