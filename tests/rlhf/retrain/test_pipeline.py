"""The whole retrain job on a tiny model, in its own process: feedback → reward model → PPO → eval → publish."""
from __future__ import annotations

import pytest

from rlhf.retrain.data import dry_run
from rlhf.retrain.progress import estimate_minutes
from rlhf.jobs.runner import JobRunner
from rlhf.jobs.scheduler import StudioScheduler
from rlhf.serving.policy_server import AdapterRef, GenParams

pytestmark = pytest.mark.slow  # trains or starts processes: not in `make test-fast`

FAST = {"reward.epochs": 1, "reward.min_pairs": 4, "reward.batch_size": 4, "reward.max_length": 128,
        "ppo.steps": 2, "ppo.batch_size": 2, "ppo.group_size": 2, "ppo.mini_batch_size": 2, "ppo.max_new_tokens": 8,
        "eval.max_new_tokens": 8, "ppo.eval_prompts": 4, "ppo.save_every": 1, "retrain.min_win_rate": 0.0, "retrain.max_kl": 1000.0}


@pytest.fixture
def store(tmp_path, tiny_model_dir):
    """The Store with its default agent on the tiny model: a job trains on the agent's own base."""
    from storage import Store

    s = Store(tmp_path / "studio.db")
    s.ensure_default_agent(str(tiny_model_dir))
    yield s
    s.close()


def seed_feedback(store, n=12):
    """n prompts with two replies each; the annotator always prefers the reply that says 'thanks'."""
    for i in range(n):
        conv = store.create_conversation("assistant", "ann", messages=[{"role": "user", "content": f"question {i}"}])
        user = store.leaf(conv.id)
        good = store.record_reply(user.id, f"answer {i}, thanks!", 1)
        bad = store.record_reply(user.id, f"answer {i}.", 1)
        store.record_comparison(good.id, bad.id, "a", "ann")


def test_dry_run_says_what_is_missing_then_ready(store, app_config):
    early = dry_run(store, app_config, "assistant")
    assert early["ready"] is False and "more" in early["missing"] and early["pairs"] == 0
    seed_feedback(store, 16)
    ready = dry_run(store, app_config, "assistant")
    assert ready["ready"] and ready["pairs"] == 16 and ready["feedback_count"] == 16
    assert ready["estimated_minutes"] > 0 and "missing" not in ready


def test_estimate_grows_with_data_and_steps(app_config):
    rates = {"reward_s_per_pair": 1.0, "ppo_s_per_sample": 2.0, "eval_s": 10.0, "overhead_s": 0.0}
    small = estimate_minutes(rates, 10, app_config)
    assert estimate_minutes(rates, 100, app_config) > small
    ppo = app_config.ppo
    assert small == pytest.approx((10 * app_config.reward.epochs + 2.0 * ppo.steps * ppo.batch_size *
                                   ppo.group_size + 10) / 60, abs=0.1)


def test_retrain_publishes_a_version_the_app_serves(store, app_config, tiny_server):
    seed_feedback(store)
    sched = StudioScheduler(store, app_config, JobRunner(store, app_config))
    job = sched.enqueue("retrain", "assistant", FAST, reason="test")
    done = sched.runner.wait(job.id, timeout=600)
    assert done.status == "succeeded", done.error
    result = done.result
    policy = store.get_policy(result["policy_id"])
    assert policy.version == 1 and policy.parent_id == 1 and policy.job_id == job.id
    assert policy.reward_model_id == result["reward_model_id"]
    assert policy.data_snapshot == store.feedback_watermark("assistant")
    assert policy.config["ppo"]["steps"] == 2  # the full config it ran with
    assert {"eval/reward", "eval/kl", "eval/win_rate", "feedback_used"} <= set(policy.metrics)
    assert policy.metrics["feedback_used"] == 12
    assert (policy.status == "active") == result["promoted"]
    # 12 pairs are too few to keep a judge's share out of PPO's reward model: people decide, nothing promotes
    gate = result["gate"]
    assert gate["verdict"] == "inconclusive" and gate["evidence"]["source"] == "none" and not result["promoted"]
    assert set(gate["guard"]) >= {"tripped", "examples", "checks"} and "off_prompt" in gate["guard"]["checks"]
    assert policy.metrics["gate/verdict"] == "inconclusive" and policy.status == "candidate"
    keys = {r["key"] for r in store.job_metrics(job.id)}
    assert {"reward/mean", "ppo/kl", "loss/policy", "eval/win_rate"} <= keys
    assert len(store.eval_samples(policy.id)) == 4 and len(store.eval_samples(1)) == 4
    assert set(result["phase_seconds"]) >= {"data", "reward", "ppo", "eval", "publish"}
    assert set(result["ppo_phase_seconds"]) >= {"generate", "update", "eval"} and 0 < result["eval_share"] < 1
    assert result["eval_share"] < result["eval_share_with_ppo"] < 1
    assert result["seconds"] >= sum(result["phase_seconds"].values()) - 0.01
    # the running app serves the new version at once, on its shared base
    text = tiny_server.generate("", [{"role": "user", "content": "hi"}], AdapterRef(policy.id, policy.adapter_path),
                                GenParams(max_new_tokens=4, temperature=0))
    assert isinstance(text, str)
    # the on-demand eval-samples job rewrites them
    again = sched.enqueue("eval_samples", "assistant", FAST, key=f"policy{policy.id}", policy_id=policy.id)
    assert sched.runner.wait(again.id, timeout=300).status == "succeeded"
    assert len(store.eval_samples(policy.id)) == 4


def test_retrain_with_dpo_publishes_a_version_gated_like_ppo(store, app_config, tiny_server):
    """retrain.method=dpo: the same job (reward model for the gate, evaluation, guard, gate, publish) with TRL's
    DPOTrainer on the votes instead of PPO; KL to the base is measured by the evaluation."""
    seed_feedback(store)
    sched = StudioScheduler(store, app_config, JobRunner(store, app_config))
    job = sched.enqueue("retrain", "assistant", {**FAST, "retrain.method": "dpo", "dpo.epochs": 1,
                                                 "dpo.batch_size": 4}, reason="test")
    done = sched.runner.wait(job.id, timeout=600)
    assert done.status == "succeeded", done.error
    result = done.result
    policy = store.get_policy(result["policy_id"])
    assert policy.config["retrain"]["method"] == "dpo" and policy.metrics["retrain/method"] == "dpo"
    assert policy.metrics["dpo/pairs"] == 12 and policy.reward_model_id == result["reward_model_id"]
    assert policy.metrics["eval/kl"] == policy.metrics["eval/kl"]  # measured (not NaN) by the evaluation
    assert "ppo" not in result["phase_seconds"] and {"reward", "dpo", "eval"} <= set(result["phase_seconds"])
    assert set(result["ppo_phase_seconds"]) == {"prepare", "update"} and "dpo_s_per_pair" in result["rates"]
    assert result["gate"]["verdict"] == "inconclusive" and "checks" in result["gate"]["guard"]
    keys = {r["key"] for r in store.job_metrics(job.id)}
    assert {"loss/policy", "dpo/reward_margin", "eval/win_rate"} <= keys
    text = tiny_server.generate("", [{"role": "user", "content": "hi"}], AdapterRef(policy.id, policy.adapter_path),
                                GenParams(max_new_tokens=4, temperature=0))
    assert isinstance(text, str)
    assert dry_run(store, app_config, "assistant", {"retrain.method": "dpo"})["estimated_minutes"] > 0


def test_retrain_with_online_dpo_ranks_the_policys_replies_with_the_jobs_reward_model(store, app_config, tiny_server):
    """retrain.method=online_dpo: in the job process, the fitted reward model ranks replies the starting version
    samples on the snapshot's prompts, and DPO learns from the votes plus those pairs."""
    seed_feedback(store)
    sched = StudioScheduler(store, app_config, JobRunner(store, app_config))
    job = sched.enqueue("retrain", "assistant", {
        **FAST, "retrain.method": "online_dpo", "online_dpo.epochs": 1, "online_dpo.batch_size": 4,
        "online_dpo.prompts": 6, "online_dpo.samples": 2, "online_dpo.max_new_tokens": 8,
        "online_dpo.min_confidence": 0.5}, reason="test")
    done = sched.runner.wait(job.id, timeout=600)
    assert done.status == "succeeded", done.error
    result = done.result
    policy = store.get_policy(result["policy_id"])
    assert policy.metrics["retrain/method"] == "online_dpo" and policy.metrics["online_dpo/pairs"] == 12
    assert policy.metrics["online_dpo/sampled_prompts"] == 6 and policy.metrics["online_dpo/sampled_replies"] == 12
    ranked = policy.metrics["online_dpo/ranked_pairs"]
    assert ranked + policy.metrics["online_dpo/unsure_prompts"] + policy.metrics["online_dpo/alike_prompts"] == 6
    assert {"sample", "prepare", "update"} == set(result["ppo_phase_seconds"])
    assert "online_dpo_s_per_pair" in result["rates"] and result["gate"]["verdict"] == "inconclusive"
    text = tiny_server.generate("", [{"role": "user", "content": "hi"}], AdapterRef(policy.id, policy.adapter_path),
                                GenParams(max_new_tokens=4, temperature=0))
    assert isinstance(text, str)


def test_retrain_without_enough_data_fails_and_publishes_nothing(store, app_config):
    sched = StudioScheduler(store, app_config, JobRunner(store, app_config))
    job = sched.enqueue("retrain", "assistant", FAST, reason="test")
    done = sched.runner.wait(job.id, timeout=300)
    assert done.status == "failed" and "NotEnoughData" in done.error
    assert len(store.list_policies("assistant")) == 1
