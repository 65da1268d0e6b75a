"""The REST API fuzzed from its own OpenAPI document (issue 28): Schemathesis reads the live
``/api/v1/openapi.json`` of a real app process and sends generated requests to every operation.

Every response must be documented (status code, content type, body schema), none may be a server error (the
documented 503 "busy" aside), and a refused request (any 4xx/5xx) must leave the database exactly as it was:
the whole content of every table is compared before and after it. Deterministic: Hypothesis runs derandomized
with no example database, so every run sends the same cases; failures are collected (not shrunk) and reported
together. The budget: each operation's schema examples and coverage cases, plus ``FUZZ_EXAMPLES`` generated
ones (``RLHF_FUZZ_EXAMPLES`` overrides it: the README's longer run uses 400).
"""
from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections import Counter

import pytest

from tests.e2e.app_process import TEST_APP, AppProcess, seed_preferences, write_config

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, settings  # noqa: E402  (after the skip: it comes with schemathesis)
from schemathesis import checks as st_checks  # noqa: E402
from schemathesis.core.failures import FailureGroup  # noqa: E402
from schemathesis.generation.hypothesis.builder import (  # noqa: E402
    HypothesisTestConfig, HypothesisTestMode, create_test)
from schemathesis.specs.openapi import checks as oa_checks  # noqa: E402

pytestmark = pytest.mark.slow

FUZZ_EXAMPLES = int(os.environ.get("RLHF_FUZZ_EXAMPLES", "40"))
# A tiny generation limit and no background work: no scheduler (a queued retrain stays queued, so POST /train
# costs a row, never minutes of training) and no vote-queue refill (the database changes only by requests).
FUZZ_APP = {"serving": {"max_new_tokens": 2}, "scheduler": {"enabled": False}, "queue": {"refill": False}}
CHECKS = [st_checks.not_a_server_error, oa_checks.status_code_conformance, oa_checks.content_type_conformance,
          oa_checks.response_schema_conformance]


@pytest.fixture(scope="module")
def app(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("fuzz")
    config = write_config(root / "config.yaml", TEST_APP, FUZZ_APP)
    with AppProcess(root / "data", tiny_model_dir, config) as running:
        with running.client() as http:  # a few conversations, replies, ratings and votes: small ids exist
            seed_preferences(http, 2)
        yield running


def snapshot(db) -> str:
    """A digest of every row of every table: equal digests, equal databases."""
    digest = hashlib.sha256()
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    for table in tables:
        digest.update(table.encode())
        for row in db.execute(f'SELECT * FROM "{table}" ORDER BY rowid'):
            digest.update(repr(row).encode())
    return digest.hexdigest()


def fuzz_operation(operation, base_url: str, db, found: dict, tally: Counter) -> None:
    """One operation's cases: its schema examples, Schemathesis' coverage cases (boundary values, missing and
    wrong-typed fields, each documented constraint broken once) and ``FUZZ_EXAMPLES`` generated ones (as
    ``st run`` sends them). Problems go to ``found``, one per operation, check and status."""
    def one_case(case):
        before = snapshot(db)
        response = case.call(base_url=base_url, timeout=60)
        tally[operation.label] += 1
        tally[response.status_code] += 1
        # 503 is documented ("busy, retry"): its body and headers are still checked like any response.
        checks = [c for c in CHECKS if not (response.status_code == 503 and c is st_checks.not_a_server_error)]
        try:
            case.validate_response(response, checks=checks)
        except FailureGroup as group:  # collected, not raised: no shrinking, every operation still runs
            for failure in group.exceptions:
                found.setdefault((operation.label, failure.title, response.status_code), str(group))
        if response.status_code >= 400 and snapshot(db) != before:
            found.setdefault((operation.label, "a refused request changed the database", response.status_code),
                             case.as_curl_command())

    budget = settings(max_examples=FUZZ_EXAMPLES, derandomize=True, database=None, deadline=None,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    modes = [HypothesisTestMode.EXAMPLES, HypothesisTestMode.COVERAGE, HypothesisTestMode.FUZZING]
    create_test(operation=operation, test_func=one_case,
                config=HypothesisTestConfig(project=operation.schema.config, modes=modes, settings=budget,
                                            apply_ci_profile=False))()


def test_the_rest_api_survives_its_own_fuzzer(app):
    schema = schemathesis.openapi.from_url(app.api + "/openapi.json")
    operations = [op.ok() for op in schema.get_all_operations()]
    assert len(operations) >= 27
    db = sqlite3.connect(f"file:{app.data_dir / 'studio.db'}?mode=ro", uri=True)
    found: dict = {}
    tally: Counter = Counter()
    started = time.monotonic()
    for operation in operations:
        fuzz_operation(operation, app.url, db, found, tally)
    elapsed = time.monotonic() - started
    cases = sum(tally[op.label] for op in operations)
    statuses = {k: v for k, v in sorted(tally.items(), key=str) if isinstance(k, int)}
    print(f"\nfuzz: {cases} cases over {len(operations)} operations in {elapsed:.1f} s; statuses {statuses}")
    assert not [op.label for op in operations if not tally[op.label]], "operations that never ran"
    assert not found, f"{len(found)} problems:\n" + "\n".join(f"{k}" for k in found) + "\n\nThe first:\n" \
        + "\n\n".join(list(found.values())[:5])
