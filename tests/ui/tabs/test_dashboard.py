"""Dashboard tab handlers on a real Store: versions table, plots, curves, eval replies, admin actions."""
from __future__ import annotations

import gradio as gr
import pytest

from ui.views import text as text_views
from ui.tabs import dashboard
from ui.auth import Auth


@pytest.fixture
def published(services, tmp_path):
    """v0 (base) → v1 (active, from a retrain job with curves, a reward model, eval replies) → v2 (candidate)."""
    store = services.store
    v0 = store.active_policy("assistant")
    job = store.enqueue_job("retrain", "assistant", {})
    for step, (reward, kl) in enumerate([(0.1, 0.0), (0.4, 0.5), (0.7, 0.9)]):
        store.log_metrics(job.id, step, {"reward/mean": reward, "ppo/kl": kl, "loss/value": 1.0 / (step + 1)})
    rm = store.register_reward_model("assistant", str(tmp_path / "rm"), "pairwise", {}, {}, {"eval_accuracy": 0.8})
    dirs = []
    for name in ("v1", "v2"):
        (tmp_path / name).mkdir()
        dirs.append(str(tmp_path / name))
    v1 = store.register_policy_version("assistant", dirs[0], v0.id, promote=True, reward_model_id=rm.id,
                                       job_id=job.id, metrics={"eval/reward": 0.25, "eval/kl": 1.5,
                                                               "feedback_used": 32})
    v2 = store.register_policy_version("assistant", dirs[1], v1.id, promote=False)
    prompts = [[{"role": "user", "content": "What is 2+2?"}], [{"role": "user", "content": "Say hi."}]]
    for policy, tag, reward in ((v0, "base", -0.5), (v1, "tuned", 0.5)):
        store.record_eval_samples(policy.id, [{"prompt": p, "reply": f"{tag} {i}", "reward": reward}
                                              for i, p in enumerate(prompts)])
    conv = store.create_conversation("assistant", messages=[{"role": "user", "content": "hi"}])
    a = store.record_reply(store.leaf(conv.id).id, "one", v1.id)
    b = store.record_reply(a.parent_id, "two", v0.id)
    store.record_rating(a.id, "alice", thumb=1)
    store.record_comparison(a.id, b.id, "a", "alice")
    return v0, v1, v2, job


def test_overview_table_plots_and_default_picks(services, published):
    v0, v1, v2, job = published
    table, ratings, volume, pick_a, pick_b, pick_admin, pick_job = dashboard.first_paint(services, "assistant")
    assert list(table["Version"]) == ["v2", "v1", "v0 · base"]
    row = table.set_index("Version").loc["v1"]
    assert (row["Status"], row["Parent"], row["Feedback used"], row["RM accuracy"]) == ("active", "v0", "32", "80%")
    assert (row["Eval reward"], row["KL to base"], row["Elo"], row["Votes"]) == ("0.250", "1.50", "1016", 1)
    assert table.set_index("Version").loc["v2", "Eval reward"] == text_views.DASH
    assert table.set_index("Version").loc["v0 · base", "Eval reward"] == "-0.500"  # its scored eval replies
    # the rating chart: one column per version on a categorical axis, an interval bar only with an interval
    assert [ratings.count(f">{v}</text>") for v in ("v0", "v1", "v2")] == [1, 1, 1]
    assert "no votes" in ratings and "1 vote, no interval" in ratings and ratings.count("<circle") == 3
    assert "ratings" in volume and "comparisons" in volume and "one bar per minute" in volume
    assert pick_a.constructor_args["value"] == v1.id  # the active version
    assert pick_b.constructor_args["value"] == v2.id  # the newest other one
    assert pick_job.constructor_args["value"] == job.id
    assert [c[1] for c in pick_a.constructor_args["choices"]] == [v2.id, v1.id, v0.id]


def test_overview_keeps_the_picks_that_still_exist(services, published):
    v0, v1, v2, job = published
    *_, pick_a, pick_b, pick_admin, pick_job = dashboard.refresh_overview(services, "assistant", v0.id, 999, v2.id,
                                                                          job.id)
    assert (pick_a.constructor_args["value"], pick_b.constructor_args["value"]) == (v0.id, v2.id)
    assert pick_admin.constructor_args["value"] == v2.id


def test_side_by_side_never_stays_on_one_version_against_itself(services, tmp_path):
    store = services.store
    v0 = store.active_policy("assistant")
    *_, pick_a, pick_b, _, _ = dashboard.first_paint(services, "assistant")
    assert pick_a.constructor_args["value"] == pick_b.constructor_args["value"] == v0.id  # nothing else yet
    (tmp_path / "v1").mkdir()
    v1 = store.register_policy_version("assistant", str(tmp_path / "v1"), v0.id, promote=False)
    *_, pick_a, pick_b, _, _ = dashboard.refresh_overview(services, "assistant", v0.id, v0.id, None, None)
    assert (pick_a.constructor_args["value"], pick_b.constructor_args["value"]) == (v0.id, v1.id)


def test_curves_default_to_reward_and_kl_one_panel_each_and_follow_the_pick(services, published):
    job = published[3]
    plot, keys = dashboard.show_curves(services, job.id, None)
    assert keys.constructor_args["value"] == ["reward/mean", "ppo/kl"]
    assert keys.constructor_args["choices"] == ["loss/value", "ppo/kl", "reward/mean"]
    assert plot.count("<svg") == 2 and 'aria-label="reward/mean"' in plot and 'aria-label="ppo/kl"' in plot
    assert "reward/mean at step 2: 0.7" in plot  # every logged value, on whole-number steps
    plot, keys = dashboard.show_curves(services, job.id, ["loss/value", "gone/key"])
    assert keys.constructor_args["value"] == ["loss/value"] and plot.count("<svg") == 1
    plot, keys = dashboard.show_curves(services, None, None)
    assert "No training curves yet" in plot


def test_side_by_side_eval_replies(services, published):
    v0, v1, v2, _ = published
    frame = dashboard.show_side_by_side(services, v0.id, v1.id)
    assert frame.values.tolist() == [["What is 2+2?", "base 0", "-0.500", "tuned 0", "0.500"],
                                     ["Say hi.", "base 1", "-0.500", "tuned 1", "0.500"]]
    assert dashboard.show_side_by_side(services, v1.id, v2.id)["v2 reply"].tolist() == [text_views.DASH] * 2


def test_admin_actions_ask_first(services, published):
    store = services.store
    v0, v1, v2, _ = published
    box, text, *yes, status = dashboard.ask(services, "promote", "assistant", v2.id)
    assert box.visible and "Promote v2?" in text and "v1 (active now)" in text
    assert [b.visible for b in yes] == [True, False, False]
    box, text, *yes, status = dashboard.ask(services, "rollback", "assistant", None)
    assert "Roll back to v0 · base?" in text and [b.visible for b in yes] == [False, True, False]
    box, text, *yes, status = dashboard.ask(services, "archive", "assistant", v2.id)
    assert "Archive v2?" in text and [b.visible for b in yes] == [False, False, True]
    box, text, *yes, status = dashboard.ask(services, "promote", "assistant", v1.id)  # already active
    assert not box.visible and "not the active one" in status
    box, text, *yes, status = dashboard.ask(services, "archive", "assistant", v1.id)  # the active one: refused now
    assert not box.visible and "active version" in status and "cannot be archived" in status
    assert [p.status for p in store.list_policies("assistant")] == ["candidate", "active", "candidate"]


def test_admin_promote_rollback_archive(services, published):
    store = services.store
    v0, v1, v2, _ = published
    assert "v2 is now the active" in dashboard.promote_version(services, v2.id, None)
    assert store.active_policy("assistant").id == v2.id
    assert "Rolled back: v1" in dashboard.rollback_version(services, "assistant", None)  # v2's parent
    assert store.active_policy("assistant").id == v1.id
    assert "archived" in dashboard.archive_version(services, v2.id, None)
    assert store.get_policy(v2.id).status == "archived"
    refused = dashboard.archive_version(services, v1.id, None)
    assert refused.startswith("⚠️") and store.get_policy(v1.id).status == "active"
    assert dashboard.promote_version(services, None, None) == "Pick a version first."


def test_annotators_can_view_but_not_change(services, published):
    store = services.store
    v0, v1, v2, _ = published
    assert all(b.interactive for b in dashboard.admin_access(services, None)[:5])  # local mode: admin
    services.auth = Auth(store, "users", {"ann": "annotator", "root": "admin"})
    ann, root = gr.Request(username="ann"), gr.Request(username="root")
    assert all(b.interactive for b in dashboard.admin_access(services, root)[:5])
    *buttons, note = dashboard.admin_access(services, ann)
    assert not any(b.interactive for b in buttons) and "admin role" in note
    for message in (dashboard.promote_version(services, v2.id, ann),
                    dashboard.rollback_version(services, "assistant", ann),
                    dashboard.archive_version(services, v2.id, ann),
                    dashboard.regenerate_eval(services, "assistant", v2.id, ann)):
        assert "admin role" in message
    assert [p.status for p in store.list_policies("assistant")] == ["candidate", "active", "candidate"]
    assert len(store.list_jobs("assistant")) == 1
    assert len(dashboard.first_paint(services, "assistant")[0]) == 3  # viewing still works


def test_regenerate_eval_queues_a_job(services, published):
    store = services.store
    v0, v1, v2, _ = published
    message = dashboard.regenerate_eval(services, "assistant", v2.id, None)
    job = store.list_jobs("assistant")[0]
    evals = lambda: [j for j in store.list_jobs("assistant") if j.kind == "eval_samples"]  # noqa: E731
    assert (job.kind, job.status, job.config["policy_id"]) == ("eval_samples", "queued", v2.id)
    assert job.config["app"]["base_model"] == services.config.base_model  # runs with the app's full config
    assert f"job #{job.id}" in message and "v2" in message
    again = dashboard.regenerate_eval(services, "assistant", v2.id, None)  # a double click: one job
    assert f"job #{job.id}" in again and len(evals()) == 1
    other = dashboard.regenerate_eval(services, "assistant", v1.id, None)  # another version queues beside it
    assert "v1" in other and len(evals()) == 2
