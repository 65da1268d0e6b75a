"""Reward model: a tiny model learns a planted preference, reloads with the same scores; data and file errors."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlhf.config import RewardConfig, load_config
from rlhf.training.data import NotEnoughData
from rlhf.training.reward import (RewardModelError, choose_mode, load_reward_model, prepare_data,
                                  train_reward_model)
from rlhf.training.reward_metrics import pair_metrics, point_metrics
from rlhf.training.tokens import encode
from storage import NotFound, Store

pytestmark = pytest.mark.slow  # trains or starts processes: not in `make test-fast`

FAST = ["reward.method=lora", "reward.learning_rate=0.003", "reward.lora_r=8", "reward.lora_alpha=16",
        "gate.judge_share=0"]  # these tests are about the reward model on every pair; the judge has its own test


def tiny_config(data_dir: Path, model_dir: Path, *extra: str):
    return load_config(env={}, overrides=[f"data_dir={data_dir}", f"base_model={model_dir}", "device=cpu",
                                          *FAST, *extra])


def plant(store: Store, n: int, seed: int = 0, first: int = 0) -> None:
    """n conversations, two replies each; the annotator always prefers the one ending in 'thanks'."""
    rng = random.Random(seed)
    for i in range(first, first + n):
        conv = store.create_conversation("assistant", annotator="ann")
        user = store.append_messages(conv.id, [{"role": "user", "content": f"Tell me about thing {i}."}])[-1]
        body = f"Thing {i} is a thing with {rng.choice(['four', 'six', 'nine'])} parts"
        good, bad = f"{body}, thanks", f"{body}, sorry"
        first_text, second_text = (good, bad) if rng.random() < 0.5 else (bad, good)
        a = store.record_reply(user.id, first_text, None)
        b = store.record_reply(user.id, second_text, None)
        store.record_comparison(a.id, b.id, "a" if first_text == good else "b", annotator="ann")


def reward_dirs(config) -> list[Path]:
    root = config.data_path / "reward_models"
    return sorted(root.iterdir()) if root.exists() else []


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    """One short CPU run on 40 planted comparisons, shared by the tests below."""
    root = tmp_path_factory.mktemp("reward")
    config = tiny_config(root / "data", tiny_model_dir, "reward.epochs=3")
    store = Store(config.db_path)
    store.ensure_default_agent(str(tiny_model_dir))
    plant(store, 40)
    events = []
    result = train_reward_model(store, config, progress=lambda f, phase, m: events.append((f, phase, m)))
    yield SimpleNamespace(store=store, config=config, result=result, events=events)
    store.close()


def test_a_tiny_model_learns_the_planted_preference(trained):
    r = trained.result
    assert r.mode == "pairwise" and r.pairs_train + r.pairs_eval == 40 and r.pairs_eval >= 6
    assert r.eval_accuracy >= 0.85  # chance is 0.5
    m = r.metrics
    assert m["reward/train_accuracy"] >= 0.9 and m["reward/eval_margin"] > 0.5
    assert m["reward/pairs_comparison"] == 40 and m["reward/pairs_siblings"] == 0
    assert all(v is None or math.isfinite(v) for v in m.values())
    losses = [e[2]["reward/train_loss"] for e in trained.events if e[1] == "reward/train"]
    assert len(losses) >= 6 and sum(losses[-3:]) < sum(losses[:3])  # the loss went down
    fractions = [e[0] for e in trained.events]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0
    assert [e[1] for e in trained.events][-1] == "reward/done"


def test_the_run_is_registered_with_its_snapshot_and_a_complete_directory(trained):
    store, r = trained.store, trained.result
    rec = store.get_reward_model(r.reward_model_id)
    assert rec.path == r.path and rec.mode == "pairwise"
    assert rec.data_snapshot == store.feedback_watermark("assistant") == {"rating_id": 0, "comparison_id": 40}
    assert rec.metrics["reward/eval_accuracy"] == r.eval_accuracy
    assert rec.config["reward"]["learning_rate"] == 0.003
    path = Path(r.path)
    assert path.parent == trained.config.data_path / "reward_models"
    assert [p.name for p in reward_dirs(trained.config)] == [path.name]  # no temp dir left behind
    meta = json.loads((path / "meta.json").read_text())
    assert meta["mode"] == "pairwise" and meta["max_length"] == 512 and meta["base_source"]
    assert (path / "adapter" / "adapter_model.safetensors").is_file()
    held = [json.loads(line) for line in (path / "data" / "pairs_eval.jsonl").read_text().splitlines()]
    assert len(held) == r.pairs_eval
    assert r.summary().keys() == {"reward_model_id", "path", "mode", "method", "pairs_train", "pairs_eval",
                                  "eval_accuracy", "cv_accuracy", "cv_low", "cv_high", "verdict", "seconds"}
    assert r.summary()["method"] == "lora" and r.summary()["cv_accuracy"] == r.eval_accuracy  # one big split


def test_trained_files_reload_and_give_the_same_scores(trained):
    path = Path(trained.result.path)
    scorer = load_reward_model(path, device="cpu")
    held = [json.loads(line) for line in (path / "data" / "pairs_eval.jsonl").read_text().splitlines()]
    again = pair_metrics(scorer, held, "eval")
    m = trained.result.metrics
    assert again["eval_accuracy"] == m["reward/eval_accuracy"]
    assert again["eval_margin"] == pytest.approx(m["reward/eval_margin"], abs=1e-4)
    assert again["eval_reward_std"] == pytest.approx(m["reward/eval_reward_std"], abs=1e-4)
    # a question it never saw, the marker decides
    prompt = [{"role": "user", "content": "Tell me about thing 999."}]
    good, bad = scorer([prompt, prompt], ["Thing 999 is a thing with six parts, thanks",
                                          "Thing 999 is a thing with six parts, sorry"])
    assert good > bad


def test_scores_do_not_depend_on_batching(trained):
    scorer = load_reward_model(trained.result.path, device="cpu", batch_size=8)
    prompts = [[{"role": "user", "content": "x " * n}] for n in (1, 30, 5, 80, 2)]
    replies = ["short", "a somewhat longer reply, thanks", "", "mid, sorry", "z " * 40]
    batched = scorer(prompts, replies)
    scorer.batch_size = 1
    single = scorer(prompts, replies)
    assert batched == pytest.approx(single, abs=1e-4)
    assert len(set(round(s, 4) for s in batched)) == 5
    with pytest.raises(ValueError, match="2 prompts but 1 replies"):
        scorer(prompts[:2], replies[:1])


def test_the_score_is_read_at_the_replys_last_token(tokenizer):
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    ids = encode(tokenizer, prompt, "Hello there!", 512)
    reply_ids = tokenizer("Hello there!", add_special_tokens=False)["input_ids"]
    assert ids[-len(reply_ids):] == reply_ids and ids[-1] != tokenizer.pad_token_id
    # pad == eos on SmolLM2: the chat template's closing <|im_end|> would be taken for padding
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    assert tokenizer.eos_token_id not in ids[-len(reply_ids):]
    long = encode(tokenizer, [{"role": "user", "content": "word " * 400}], "the reply", 64)
    assert len(long) == 64 and long[-2:] == tokenizer("the reply", add_special_tokens=False)["input_ids"][-2:]


def test_a_cancel_from_the_progress_callback_stops_and_leaves_nothing(tmp_path, tiny_model_dir):
    config = tiny_config(tmp_path / "data", tiny_model_dir, "reward.epochs=1")
    store = Store(config.db_path)
    store.ensure_default_agent(str(tiny_model_dir))
    plant(store, 20)

    class Cancelled(Exception):
        pass

    def progress(fraction, phase, metrics):
        if phase == "reward/train":
            raise Cancelled()

    with pytest.raises(Cancelled):
        train_reward_model(store, config, progress=progress)
    assert store.list_reward_models() == [] and reward_dirs(config) == []
    store.close()


def test_pointwise_mode_when_pairs_are_few(tmp_path, tiny_model_dir):
    config = tiny_config(tmp_path / "data", tiny_model_dir, "reward.epochs=4", "reward.eval_fraction=0.3")
    store = Store(config.db_path)
    store.ensure_default_agent(str(tiny_model_dir))
    for i in range(12):  # one reply per question: no pairs, only scores
        conv = store.create_conversation("assistant")
        user = store.append_messages(conv.id, [{"role": "user", "content": f"Question {i}?"}])[-1]
        good = i % 2 == 0
        reply = store.record_reply(user.id, f"Answer {i}, {'thanks' if good else 'sorry'}", None)
        store.record_rating(reply.id, score=5 if good else 1)
    result = train_reward_model(store, config)
    m = result.metrics
    assert result.mode == "pointwise" and result.pairs_train == 0 and result.eval_accuracy is None
    assert m["reward/points_train"] + m["reward/points_eval"] == 12 and m["reward/points_eval"] >= 2
    assert m["reward/train_mse"] < 0.25 and m["reward/eval_mse"] < 0.25  # predicting 0.5 everywhere gives 0.25
    assert m["reward/eval_spearman"] > 0.5
    assert store.get_reward_model(result.reward_model_id).mode == "pointwise"
    scorer = load_reward_model(result.path, device="cpu")
    prompt = [{"role": "user", "content": "Question 77?"}]
    good, bad = scorer([prompt, prompt], ["Answer 77, thanks", "Answer 77, sorry"])
    assert good > bad
    store.close()


def test_mode_choice_and_not_enough_data_messages():
    cfg = RewardConfig()
    assert choose_mode(cfg, 16, 0) == "pairwise"
    assert choose_mode(cfg, 15, 8) == "pointwise"
    with pytest.raises(NotEnoughData, match="at least 16 preference pairs, .*have 15 pairs.* 8 rated replies \\(have 7\\)") \
            as info:
        choose_mode(cfg, 15, 7)
    assert (info.value.needed, info.value.have) == (16, 15)
    assert choose_mode(RewardConfig(mode="pairwise"), 2, 0) == "pairwise"
    with pytest.raises(NotEnoughData, match="at least 2 preference pairs"):
        choose_mode(RewardConfig(mode="pairwise"), 1, 100)
    assert choose_mode(RewardConfig(mode="pointwise"), 100, 8) == "pointwise"
    with pytest.raises(NotEnoughData, match="at least 8 rated replies"):
        choose_mode(RewardConfig(mode="pointwise"), 100, 7)
    with pytest.raises(ValueError, match="reward.mode"):
        choose_mode(RewardConfig(mode="both"), 100, 100)


def test_ties_and_ratings_count_toward_a_retrain_with_enough_decided_pairs():
    """16 votes of which 2 are ties used to be refused ("2 more preference pairs"): the minimum is on the feedback,
    with reward.min_decided_pairs decided pairs among it."""
    cfg = RewardConfig()
    assert choose_mode(cfg, 14, 0, 16) == "pairwise"
    assert choose_mode(cfg, 8, 0, 16) == "pairwise"
    with pytest.raises(NotEnoughData) as info:
        choose_mode(cfg, 7, 0, 16)
    assert info.value.missing.endswith("1 more preference pairs (comparisons or differently rated regenerations)")
    with pytest.raises(NotEnoughData) as info:
        choose_mode(cfg, 12, 0, 14)
    assert info.value.missing.endswith("2 more votes or ratings (ties count)") and info.value.have == 14


def test_a_retrain_is_ready_after_16_votes_two_of_them_ties(store, app_config):
    from rlhf.retrain.data import dry_run

    for i in range(16):
        conv = store.create_conversation("assistant", "ann", messages=[{"role": "user", "content": f"q{i}"}])
        user = store.leaf(conv.id)
        a, b = store.record_reply(user.id, f"good {i}, thanks", 1), store.record_reply(user.id, f"bad {i}", 1)
        store.record_comparison(a.id, b.id, "tie" if i < 2 else "a", "ann")
    ready = dry_run(store, app_config, "assistant")
    assert ready["ready"] and ready["pairs"] == 14 and ready["feedback_count"] == 16
    store.set_annotator_excluded("ann", True)  # an excluded annotator's votes count for nothing
    assert not dry_run(store, app_config, "assistant")["ready"]


def test_prepare_data_splits_pairs_and_points_together(store):
    plant(store, 20)
    for conv_messages in (store.conversation_messages(c) for c in range(1, 21)):
        replies = [m for m in conv_messages if m.role == "assistant"]
        store.record_rating(replies[0].id, thumb=1)
    data = prepare_data(store.feedback_rows("assistant"), RewardConfig(eval_fraction=0.25))
    assert data.mode == "pairwise" and len(data.pairs_train) + len(data.pairs_eval) == 20
    convs = lambda rows: {c for r in rows for c in r["conversation_ids"]}  # noqa: E731
    assert convs(data.pairs_eval) == convs(data.points_eval) and len(convs(data.pairs_eval)) == 5
    assert not convs(data.pairs_train + data.points_train) & convs(data.pairs_eval + data.points_eval)
    assert data.counts["pairs_comparison"] == 20 and len(data.kto) == 20


def run_cli(capsys, *argv):
    from cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_trains_and_prints_one_json_line_last(tmp_path, tiny_model_dir, capsys):
    data_dir = tmp_path / "data"
    store = Store(data_dir / "studio.db")
    store.ensure_default_agent(str(tiny_model_dir))
    plant(store, 20)
    code, out, err = run_cli(capsys, "train-reward", "--agent", "assistant", "--set", f"data_dir={data_dir}",
                             "--set", f"base_model={tiny_model_dir}", "--set", "device=cpu",
                             "--set", "reward.cv_folds=4")  # the default method: the linear head
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1  # nothing else on stdout: scripts parse the last line
    summary = json.loads(lines[-1])
    assert list(summary) == ["reward_model_id", "path", "mode", "method", "pairs_train", "pairs_eval",
                             "eval_accuracy", "cv_accuracy", "cv_low", "cv_high", "verdict", "seconds"]
    assert summary["method"] == "head" and 0 <= summary["cv_low"] <= summary["cv_accuracy"] <= summary["cv_high"]
    assert summary["mode"] == "pairwise" and summary["pairs_train"] + summary["pairs_eval"] == 20
    assert store.get_reward_model(summary["reward_model_id"]).path == summary["path"]
    assert "reward/" in err  # progress went to stderr
    store.close()


def test_cli_exits_2_and_says_how_much_is_needed(tmp_path, tiny_model_dir, capsys):
    data_dir = tmp_path / "data"
    store = Store(data_dir / "studio.db")
    store.ensure_default_agent(str(tiny_model_dir))
    plant(store, 3)
    args = ["train-reward", "--set", f"data_dir={data_dir}", "--set", f"base_model={tiny_model_dir}"]
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert "need at least 16 preference pairs" in err and "have 3" in err and "8 rated replies (have 0)" in err
    code, out, err = run_cli(capsys, *args, "--agent", "nobody")
    assert code == 2 and "unknown agent 'nobody'" in err
    assert reward_dirs(tiny_config(data_dir, tiny_model_dir)) == [] and store.list_reward_models() == []
    store.close()


def test_broken_reward_directories_give_clear_errors(trained, tmp_path):
    import shutil

    with pytest.raises(RewardModelError, match="cannot read meta.json"):
        load_reward_model(tmp_path, device="cpu")
    broken = tmp_path / "broken"
    shutil.copytree(trained.result.path, broken)
    (broken / "adapter" / "adapter_model.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(RewardModelError, match="cannot load the adapter"):
        load_reward_model(broken, device="cpu")
    (broken / "meta.json").write_text("{not json")
    with pytest.raises(RewardModelError, match="meta.json"):
        load_reward_model(broken, device="cpu")
    moved = tmp_path / "moved"
    shutil.copytree(trained.result.path, moved)
    meta = json.loads((moved / "meta.json").read_text())
    meta.update(base_source=str(tmp_path / "gone"), base_model=str(tmp_path / "gone"))
    (moved / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(RewardModelError, match="base model .* cannot be found"):
        load_reward_model(moved, device="cpu")
    with pytest.raises(NotFound):
        trained.store.get_reward_model(999)


def test_pair_and_point_metrics_by_hand():
    def by_length(prompts, replies):  # any callable (messages, reply) -> float is a scorer
        return [float(len(r)) for r in replies]

    prompt = [{"role": "user", "content": "q"}]
    pairs = [{"prompt": prompt, "chosen": "long one", "rejected": "short"},  # +3: right
             {"prompt": prompt, "chosen": "tie", "rejected": "eit"},  # 0: counts half
             {"prompt": prompt, "chosen": "a", "rejected": "abc"}]  # -2: wrong
    m = pair_metrics(by_length, pairs, "eval")
    assert m["eval_accuracy"] == pytest.approx(1.5 / 3) and m["eval_margin"] == pytest.approx(1 / 3)
    scores, mean = [8, 3, 1, 5, 3, 3], 23 / 6
    assert m["eval_reward_mean"] == pytest.approx(mean)
    assert m["eval_reward_std"] == pytest.approx((sum((s - mean) ** 2 for s in scores) / 6) ** 0.5)
    assert pair_metrics(by_length, [], "eval") == {"eval_accuracy": None, "eval_margin": None}
    points = [{"prompt": prompt, "completion": c, "score": s}
              for c, s in (("a", 0.0), ("bb", 0.5), ("ccc", 0.25), ("dddd", 1.0))]
    m = point_metrics(by_length, points, "eval")
    assert m["eval_mse"] == pytest.approx(sum((p - s) ** 2 for p, s in ((1, 0), (2, .5), (3, .25), (4, 1))) / 4)
    assert m["eval_spearman"] == pytest.approx(0.8)  # ranks 1,2,3,4 vs 1,3,2,4: 1 - 6*2/(4*15)
    flat = [dict(p, score=0.5) for p in points]
    assert point_metrics(by_length, flat, "eval")["eval_spearman"] is None  # undefined for constant targets


def test_the_gates_judge_is_fitted_on_pairs_the_reward_model_never_sees(tmp_path, tiny_model_dir):
    import json

    from rlhf.training.judge import JUDGE_FILE
    from rlhf.training.reward import load_judge, load_reward_model

    config = load_config(env={}, overrides=[f"data_dir={tmp_path / 'data'}", f"base_model={tiny_model_dir}",
                                            "device=cpu", "reward.cv_folds=3",
                                            "gate.min_judge_pairs=8"])  # head + judge (the default's from 94 pairs)
    store = Store(config.db_path)
    store.ensure_default_agent(str(tiny_model_dir))
    plant(store, 40)
    store.ensure_annotator("nobody")
    store.set_annotator_excluded("nobody", True)
    r = train_reward_model(store, config)
    m = r.metrics
    assert 10 <= m["reward/judge_pairs"] <= 16 and m["reward/judge_test_pairs"] == r.pairs_train + r.pairs_eval
    assert r.pairs_train + r.pairs_eval + m["reward/judge_pairs"] == 40 and m["reward/pairs"] == 40
    assert 0 <= m["reward/judge_low"] <= m["reward/judge_accuracy"] <= m["reward/judge_high"] <= 1
    path = Path(r.path)
    judged = [json.loads(line) for line in (path / "data" / "pairs_judge.jsonl").read_text().splitlines()]
    trained = [json.loads(line) for line in (path / "data" / "pairs_train.jsonl").read_text().splitlines()]
    assert len(judged) == m["reward/judge_pairs"] and not {p["context_key"] for p in judged} & \
        {p["context_key"] for p in trained}
    meta = json.loads((path / "meta.json").read_text())
    assert meta["judge"] is True and meta["excluded_annotators"] == ["nobody"]
    scorer = load_reward_model(r.path, device="cpu")
    judge = load_judge(r.path, scorer.features)
    assert (path / JUDGE_FILE).is_file() and judge.member_scores([[{"role": "user", "content": "hi"}]], ["x"]).shape \
        == (1, config.reward.ensemble)
    store.close()
