"""A verdicts.json that records a fault for every engine (stale, or written by someone with the data dir) leads to one
re-proof, not a dead app; the recorded text is cleaned before /health and the Training tab show it (issue 41)."""
from __future__ import annotations

import json

import pytest

from rlhf.config import apply_overrides
from rlhf.serving.policy_server import load_server
from rlhf.serving.startup import MAX_FAULT_CHARS, Verdicts, engine_specs

pytestmark = pytest.mark.slow  # an engine process starts for real

HOSTILE = "<script>alert(1)</script>\n\x1b[31m[click](javascript:alert(1))\r" + "x" * 1000


def test_a_verdict_file_that_faults_every_engine_leads_to_one_re_proof(app_config):
    config = apply_overrides(app_config, {"serving.engine": "transformers", "serving.isolation": "process"})
    specs, _ = engine_specs(config, "cpu")
    path = config.paths.serving_verdicts
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({Verdicts.key(s): {"engine": s.label, "fault": HOSTILE} for s in specs}))
    server = load_server(config)
    try:
        status = server.engine_status
        assert server.engine_name == "transformers" and "proving again" in status
        assert status.isprintable() and "\n" not in status and "x" * (MAX_FAULT_CHARS + 1) not in status
    finally:
        server.close()
    assert all(Verdicts(path).fault(s) is None for s in specs)  # proved: the next start trusts the engine again
