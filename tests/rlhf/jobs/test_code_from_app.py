"""Code comes only from the running app's config: a job row's saved config, or a module planted in the data dir,
never decides what a job process imports (issue 41, items 2 and 11)."""
from __future__ import annotations

import pytest

from rlhf.config import AppConfig, apply_overrides
from rlhf.jobs.runner import JobRunner
from storage import Store
from tests.support.job_kinds import SELFTEST, with_selftest

pytestmark = pytest.mark.slow  # starts job processes: not in `make test-fast`

PLANTED = '''
from pathlib import Path
Path({marker!r}).write_text("imported")


def run(ctx):
    Path({marker!r}).write_text("ran")
    return {{}}


def score(messages, reply):
    Path({marker!r}).write_text("scored")
    return 1.0
'''


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A data dir at ``tmp_path/data`` that holds ``jobs/pwn.py`` and ``policies/pwn.py``, with ``tmp_path`` on
    the job process's path the way the project root that holds ``./data`` is; the marker file they would write."""
    marker = tmp_path / "pwned"
    for sub in ("jobs", "policies"):
        (tmp_path / "data" / sub).mkdir(parents=True, exist_ok=True)
        (tmp_path / "data" / sub / "pwn.py").write_text(PLANTED.format(marker=str(marker)))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return marker


HOSTILE = {"scheduler.job_kinds": {"pwn": "pwn:run", "pwn2": "data.policies.pwn:run"},
           "ppo.reward_functions": {"data.policies.pwn:score": 1.0}}


def test_a_job_rows_saved_config_names_no_code(app_config, planted, tmp_path):
    app_config = with_selftest(app_config)
    store = Store(app_config.db_path)
    store.ensure_default_agent("tiny")
    hostile = apply_overrides(AppConfig(), HOSTILE).to_dict()  # as a restored database or an old queue holds it
    jobs = {kind: store.enqueue_job(kind, "assistant", {"app": hostile}).id for kind in ("pwn", "pwn2", "whereami")}
    runner = JobRunner(store, app_config)
    try:
        done = {kind: runner.wait(job_id, timeout=120) for kind, job_id in jobs.items()}
    finally:
        runner.shutdown()
    for kind in ("pwn", "pwn2"):
        assert done[kind].status == "failed" and f"unknown job kind {kind!r}" in done[kind].error
    where = done["whereami"].result
    assert done["whereami"].status == "succeeded", done["whereami"].error
    assert where["job_kinds"] == SELFTEST and where["reward_functions"] == {}  # the app's, not the row's
    data = str(tmp_path / "data")
    assert where["cwd"] == str(app_config.paths.job_logs)  # not the project root
    assert not [p for p in where["sys_path"] if p.startswith(data)]
    assert not planted.exists()
    store.close()


def test_the_job_process_imports_nothing_from_the_data_dir(app_config, planted):
    """Even the app's own config cannot reach a module in the data dir: not through the job's working directory,
    nor through the data dir seen as a package from the project root."""
    app_config = apply_overrides(app_config, {"scheduler.job_kinds": HOSTILE["scheduler.job_kinds"]})
    store = Store(app_config.db_path)
    store.ensure_default_agent("tiny")
    pwn = store.enqueue_job("pwn", "assistant", {"app": app_config.to_dict()})
    pwn2 = store.enqueue_job("pwn2", "assistant", {"app": app_config.to_dict()})
    runner = JobRunner(store, app_config)
    try:
        pwn, pwn2 = runner.wait(pwn.id, timeout=120), runner.wait(pwn2.id, timeout=120)
    finally:
        runner.shutdown()
    assert pwn.status == "failed" and "cannot import 'pwn'" in pwn.error
    assert pwn2.status == "failed" and "refusing to import 'data'" in pwn2.error
    assert not planted.exists()
    store.close()
