"""The job kinds the app ships, as ``name -> "module:function"``: a table, so the job machinery (``rlhf/jobs``)
imports nothing of what it runs; the job process imports a kind's module only when it runs one.

A new kind is a function ``fn(ctx: JobContext) -> result dict`` in its own module and one line here. Kinds that do
not ship with the app (a plugin's, a test's) are named in the server's config, ``scheduler.job_kinds``.
"""
from __future__ import annotations

JOB_KINDS = {
    "retrain": "rlhf.retrain.pipeline:retrain",
    "eval_samples": "rlhf.retrain.pipeline:eval_samples",
}
