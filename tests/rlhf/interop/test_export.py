"""Every export format is written from a real Store and loaded back with its consumer's own loader."""
from __future__ import annotations

import json

import pytest

from rlhf.config import load_config
from rlhf.interop.export import FORMATS, ExportError, archive, export
from rlhf.interop.recipes import OPENRLHF_VERSION, VERL_VERSION

N_CONVERSATIONS = 4


@pytest.fixture
def config(tmp_path):
    return load_config(env={}, overrides=[f"data_dir={tmp_path / 'data'}"])


@pytest.fixture
def filled(store):
    """Conversations with sibling replies, thumbs, scores, flags and votes by three annotators (one excluded)."""
    policy = store.active_policy("assistant").id
    for i in range(N_CONVERSATIONS):
        conv = store.create_conversation("assistant", "alice", messages=[{"role": "user", "content": f"question {i}"}])
        user = store.leaf(conv.id)
        good = store.record_reply(user.id, f"a careful answer {i}", policy)
        bad = store.record_reply(user.id, f"nonsense {i}", policy)
        store.record_rating(good.id, "alice", thumb=1, score=5)
        store.record_rating(bad.id, "alice", thumb=-1, score=1, flags=["Inaccurate"], note="wrong")
        store.record_comparison(good.id, bad.id, "a", "bob")
        store.record_rating(bad.id, "mallory", thumb=1)  # excluded below: must not reach training formats
    follow = store.append_messages(1, [{"role": "user", "content": "and then?"}], parent_id=3)[-1]
    store.record_reply(follow.id, "then this", policy)
    store.set_annotator_excluded("mallory", True)
    return store


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_has_every_event_with_full_context(filled, config, tmp_path):
    from datasets import load_dataset

    result = export(filled, config, "jsonl", tmp_path / "out.jsonl", agent="assistant")
    rows = read_jsonl(result.path)
    assert len(rows) == filled.count("ratings") + filled.count("comparisons") == result.counts["events"]
    rating = next(r for r in rows if r["event"] == "rating" and r["note"] == "wrong")
    assert rating["prompt"][0]["role"] == "system" and rating["prompt"][-1]["content"].startswith("question")
    assert rating["flags"] == ["Inaccurate"] and rating["annotator"] == "alice" and rating["reply"].startswith("nonsense")
    vote = next(r for r in rows if r["event"] == "comparison")
    assert vote["winner"] == "a" and vote["reply"].startswith("a careful") and vote["same_context"] is True
    assert {r["annotator"] for r in rows if r["annotator_excluded"]} == {"mallory"}  # raw formats keep them
    assert len(load_dataset("json", data_files=str(result.path), split="train")) == len(rows)


def test_parquet_and_hf_load_back(filled, config, tmp_path):
    import pandas as pd
    from datasets import load_dataset, load_from_disk

    pq_result = export(filled, config, "parquet", tmp_path / "out.parquet")
    frame = pd.read_parquet(pq_result.path)
    assert len(frame) == pq_result.counts["events"] and {"prompt", "reply", "winner", "thumb"} <= set(frame.columns)
    assert len(load_dataset("parquet", data_files=str(pq_result.path), split="train")) == len(frame)
    hf_result = export(filled, config, "hf", tmp_path / "hf")
    ds = load_from_disk(str(hf_result.path))
    assert len(ds) == len(frame) and ds.features["prompt"].feature["role"].dtype == "string"
    assert ds[0]["event"] in ("rating", "comparison")


def test_trl_preference_trains_with_reward_trainer(filled, config, tmp_path, tiny_model_dir, tokenizer):
    from datasets import load_dataset
    from transformers import AutoModelForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    result = export(filled, config, "trl-preference", tmp_path / "pairs.jsonl")
    rows = read_jsonl(result.path)
    # One pair per conversation: bob's vote covers the siblings; mallory's thumbs-up on "nonsense" is excluded.
    assert len(rows) == N_CONVERSATIONS
    assert all(r["chosen"][0]["content"].startswith("a careful") for r in rows)
    assert rows[0]["chosen"][0]["role"] == "assistant" and rows[0]["prompt"][-1]["role"] == "user"
    ds = load_dataset("json", data_files=str(result.path), split="train")
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    args = RewardConfig(output_dir=str(tmp_path / "rm"), max_steps=1, per_device_train_batch_size=2, use_cpu=True,
                        report_to=[], save_strategy="no", logging_steps=1, max_length=256)
    trainer = RewardTrainer(model=model, args=args, train_dataset=ds, processing_class=tokenizer)
    out = trainer.train()
    assert out.global_step == 1 and out.training_loss == out.training_loss  # finite, not NaN


def test_kto_trains_with_kto_trainer(filled, config, tmp_path, tiny_model_dir, tokenizer):
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM
    from trl import KTOConfig, KTOTrainer

    result = export(filled, config, "kto", tmp_path / "kto.jsonl")
    rows = read_jsonl(result.path)
    assert sorted(r["label"] for r in rows) == [False] * N_CONVERSATIONS + [True] * N_CONVERSATIONS
    ds = load_dataset("json", data_files=str(result.path), split="train")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    args = KTOConfig(output_dir=str(tmp_path / "kto"), max_steps=1, per_device_train_batch_size=4, use_cpu=True,
                     report_to=[], save_strategy="no", logging_steps=1, max_length=256)
    out = KTOTrainer(model=model, args=args, train_dataset=ds, processing_class=tokenizer).train()
    assert out.global_step == 1


def test_openrlhf_files_follow_its_keys(filled, config, tmp_path, tokenizer):
    from datasets import load_dataset

    result = export(filled, config, "openrlhf", tmp_path / "openrlhf", agent="assistant")
    assert set(result.files) == {"rm_pairs.jsonl", "prompts.jsonl", "LAUNCH.md"}
    pairs = load_dataset("json", data_files=str(result.path / "rm_pairs.jsonl"), split="train")
    row = pairs[0]
    # What OpenRLHF's reward dataset does with --prompt_key/--chosen_key/--apply_chat_template:
    prompt = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    chosen = tokenizer.apply_chat_template(row["prompt"] + row["chosen"], tokenize=False)[len(prompt):]
    assert "a careful answer" in chosen and "question" in prompt
    prompts = load_dataset("json", data_files=str(result.path / "prompts.jsonl"), split="train")
    assert len(prompts) == N_CONVERSATIONS + 1  # plus the follow-up state
    assert tokenizer.apply_chat_template(prompts[0]["context_messages"], tokenize=False, add_generation_prompt=True)
    launch = (result.path / "LAUNCH.md").read_text()
    # Four pairs are less than one batch on the recipe's 8 GPUs: LAUNCH.md says so instead of giving commands
    # (test_recipes.py checks the full recipes against OpenRLHF's own code).
    for needle in (f"OpenRLHF {OPENRLHF_VERSION}", f"EXPORT_DIR={result.path}", "4 preference pairs",
                   "Too little data"):
        assert needle in launch, needle
    assert "ray job submit" not in launch


def test_verl_parquet_has_its_schema(filled, config, tmp_path):
    from datasets import load_dataset

    result = export(filled, config, "verl", tmp_path / "verl")
    assert {"train.parquet", "test.parquet", "rm/train.parquet", "LAUNCH.md"} <= set(result.files)
    train = load_dataset("parquet", data_files=str(result.path / "train.parquet"), split="train")
    test = load_dataset("parquet", data_files=str(result.path / "test.parquet"), split="train")
    assert len(train) + len(test) == N_CONVERSATIONS + 1 and len(test) >= 1
    row = train[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == "rlhf-studio/assistant" and row["prompt"][-1]["role"] == "user"
    assert row["reward_model"] == {"style": "model", "ground_truth": ""}
    assert row["extra_info"]["split"] == "train"
    rm = load_dataset("parquet", data_files=str(result.path / "rm" / "train.parquet"), split="train")
    assert len(rm) == N_CONVERSATIONS
    launch = (result.path / "LAUNCH.md").read_text()
    assert f"verl {VERL_VERSION}" in launch and "Too little data" in launch
    assert "verl.trainer.main_ppo" not in launch


def test_errors_and_archive(filled, config, tmp_path):
    with pytest.raises(ExportError, match="unknown format"):
        export(filled, config, "csv", tmp_path / "x")
    with pytest.raises(ExportError, match="HF_TOKEN"):
        export(filled, config, "hf", tmp_path / "hf", push_to_hub="me/data")
    with pytest.raises(ExportError, match="--format hf"):
        export(filled, config, "jsonl", tmp_path / "a.jsonl", push_to_hub="me/data")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("x")
    with pytest.raises(ExportError, match="not an empty directory"):
        export(filled, config, "verl", tmp_path / "busy")
    assert (tmp_path / "busy" / "keep.txt").read_text() == "x"
    zipped = archive(export(filled, config, "openrlhf", tmp_path / "o"), tmp_path)
    import zipfile

    assert {"rm_pairs.jsonl", "prompts.jsonl", "LAUNCH.md"} <= set(zipfile.ZipFile(zipped).namelist())
    assert set(FORMATS) == {"jsonl", "parquet", "hf", "trl-preference", "kto", "openrlhf", "verl"}


def test_empty_store_exports_empty_files(store, config, tmp_path):
    import pandas as pd

    assert export(store, config, "parquet", tmp_path / "e.parquet").counts == {"events": 0}
    assert len(pd.read_parquet(tmp_path / "e.parquet")) == 0
    assert export(store, config, "kto", tmp_path / "e.jsonl").counts == {"rows": 0}


def test_a_withdrawn_thumb_is_an_event_in_raw_exports_and_gone_from_training_rows(filled, config, tmp_path):
    good = next(r for r in filled.feedback_rows("assistant")["ratings"] if r["thumb"] == 1 and r["score"] == 5)
    filled.withdraw_rating(good["message_id"], "alice")
    rows = read_jsonl(export(filled, config, "jsonl", tmp_path / "out.jsonl", agent="assistant").path)
    (withdrawal,) = [r for r in rows if r["event"] == "withdrawal"]
    assert (withdrawal["withdraws_id"], withdrawal["field"], withdrawal["annotator"]) == (good["id"], "thumb", "alice")
    kto = read_jsonl(export(filled, config, "kto", tmp_path / "kto.jsonl", agent="assistant").path)
    assert len(kto) == 2 * N_CONVERSATIONS - 1  # that reply's thumb no longer labels it
