"""The retrain's trigger rules: a feedback threshold and a cron per agent, timed by the app's scheduler."""
from __future__ import annotations

import pytest

from rlhf.jobs.scheduler import StudioScheduler
from rlhf.retrain.triggers import RetrainTriggers, Rule, should_trigger
from storage import InvalidInput


@pytest.fixture
def sched(app_config, store):
    s = StudioScheduler(store, app_config)
    yield s
    s.shutdown()


@pytest.fixture
def triggers(sched, store, app_config):
    return RetrainTriggers(store, app_config, sched).install()


@pytest.mark.parametrize("rule, feedback, minutes, expected", [
    (Rule(True, 32, 60), 31, None, False),
    (Rule(True, 32, 60), 32, None, True),
    (Rule(True, 32, 60), 40, 59.0, False),
    (Rule(True, 32, 60), 40, 61.0, True),
    (Rule(False, 32, 60), 100, None, False),
])
def test_threshold_rule(rule, feedback, minutes, expected):
    assert should_trigger(rule, feedback, minutes) is expected


def test_check_triggers_enqueues_when_enough_feedback(triggers, store):
    triggers.update_rule("assistant", Rule(True, 3, 0))
    assert triggers.check_triggers() == []
    conv = store.create_conversation("assistant", messages=[{"role": "user", "content": "q"}])
    reply = store.record_reply(store.leaf(conv.id).id, "a", 1)
    for name in ("a", "b", "c"):
        store.record_rating(reply.id, name, thumb=1)
    queued = triggers.check_triggers()
    assert len(queued) == 1 and queued[0].kind == "retrain" and queued[0].config["reason"] == "threshold"


def test_rules_survive_restarts_and_bad_cron_is_refused(app_config, store, sched):
    t = RetrainTriggers(store, app_config, sched)
    assert t.rule("assistant") == app_config.scheduler.default_rule()
    t.update_rule("assistant", Rule(True, 5, 10.0, "0 3 * * *"))
    assert RetrainTriggers(store, app_config, sched).rule("assistant") == Rule(True, 5, 10.0, "0 3 * * *")
    with pytest.raises(InvalidInput, match="cron"):
        t.update_rule("assistant", Rule(True, 5, 10.0, "every day"))
    assert t.rule("assistant").cron == "0 3 * * *"  # a refused rule is not stored


def test_the_rules_run_on_the_scheduler_timers(triggers, sched):
    """install registers the threshold check and each agent's cron; a rule saved while running reschedules it."""
    assert triggers.next_check() is None  # not started
    triggers.update_rule("assistant", Rule(True, 5, 10.0, "0 3 * * *"))
    sched.start()
    assert triggers.next_check() is not None and sched.next_run("cron:assistant") is not None
    triggers.update_rule("assistant", Rule(False, 5, 10.0, "0 3 * * *"))
    assert sched.next_run("cron:assistant") is None
    triggers.update_rule("assistant", Rule(True, 5, 10.0, "0 4 * * *"))
    assert sched.next_run("cron:assistant").hour == 4


def test_the_scheduler_knows_no_retrain(store, app_config):
    """Without the retrain's triggers wired in, the scheduler only drains the queue."""
    s = StudioScheduler(store, app_config)
    s.start()
    try:
        assert s.next_run("trigger") is None and s.next_run("drain") is not None
    finally:
        s.shutdown()
