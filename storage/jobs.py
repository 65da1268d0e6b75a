"""Jobs (the single training queue), their metrics and logs, reward models, scheduler rules, eval samples.

The jobs table is the only queue and the only source of truth about training work: the scheduler
enqueues, a runner claims with BEGIN IMMEDIATE, the job process heartbeats, the app sweeps the dead.
"""
from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Callable, Iterable, Optional

from storage.errors import Conflict, InvalidInput, NotFound
from storage.records import Job, RewardModel
from storage.util import dumps, utcnow

JOB_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")


def _age_seconds(stamp: Optional[str]) -> float:
    if not stamp:
        return math.inf
    return (datetime.now(timezone.utc) - datetime.fromisoformat(stamp)).total_seconds()


class JobsMixin:
    """Methods of Store for background work and its outputs."""

    # ---- queue -------------------------------------------------------------------------------
    def enqueue_job(self, kind: str, agent: int | str | None = None, config: Optional[dict] = None,
                    key: Optional[str] = None) -> Job:
        """Queue a job; if one of the same kind, agent and ``key`` is already queued or running, return it.

        ``key`` tells apart jobs of one kind that may wait side by side (e.g. eval samples per version).
        """
        if not isinstance(kind, str) or not kind:
            raise InvalidInput("job kind must be a non-empty string")
        agent_id = self.get_agent(agent).id if agent is not None else None
        config = {**(config or {}), **({"key": key} if key is not None else {})}
        with self._tx() as db:
            row = self._one("SELECT * FROM jobs WHERE kind = ? AND agent_id IS ? AND status IN ('queued', 'running') "
                            "AND json_extract(config, '$.key') IS ? ORDER BY id LIMIT 1", [kind, agent_id, key])
            if row:
                return Job.from_row(self._located(row, "checkpoint"))
            job_id = self._insert(db, "jobs", {"kind": kind, "agent_id": agent_id, "config": dumps(config),
                                               "created": utcnow()})
        return self.get_job(job_id)

    def claim_job(self, pid: int, kinds: Optional[Iterable[str]] = None) -> Optional[Job]:
        """Take the oldest queued job and mark it running, unless a job is running already (one at a time)."""
        with self._tx() as db:
            if self._one("SELECT id FROM jobs WHERE status = 'running' LIMIT 1"):
                return None
            sql, params = "SELECT * FROM jobs WHERE status = 'queued'", []
            if kinds is not None:
                kinds = list(kinds)
                sql += f" AND kind IN ({', '.join('?' for _ in kinds)})"
                params += kinds
            row = self._one(sql + " ORDER BY id LIMIT 1", params)
            if row is None:
                return None
            now = utcnow()
            db.execute("UPDATE jobs SET status = 'running', started = COALESCE(started, ?), heartbeat = ?, pid = ?, "
                       "phase = 'starting' WHERE id = ?", [now, now, pid, row["id"]])
        return self.get_job(row["id"])

    def set_job_pid(self, job_id: int, pid: int) -> None:
        """Record the OS process that runs a job."""
        with self._tx() as db:
            db.execute("UPDATE jobs SET pid = ?, heartbeat = ? WHERE id = ?", [pid, utcnow(), job_id])

    def job_progress(self, job_id: int, progress: Optional[float] = None, phase: Optional[str] = None,
                     message: Optional[str] = None, checkpoint: Optional[str] = None) -> bool:
        """Heartbeat plus optional progress; returns True when a cancel was requested."""
        now = utcnow()
        sets, params = ["heartbeat = ?"], [now]
        if progress is not None:
            progress = min(1.0, max(0.0, float(progress)))
            sets += ["progressed = CASE WHEN ? > progress THEN ? ELSE progressed END", "progress = ?"]
            params += [progress, now, progress]
        checkpoint = self._stored_path(checkpoint) if checkpoint is not None else None
        for name, value in (("phase", phase), ("message", message), ("checkpoint", checkpoint)):
            if value is not None:
                sets.append(f"{name} = ?")
                params.append(value)
        with self._tx() as db:
            db.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id = ? AND status = 'running'", params + [job_id])
            row = self._one("SELECT cancel_requested FROM jobs WHERE id = ?", [job_id])
        return bool(row and row["cancel_requested"])

    def finish_job(self, job_id: int, status: str, result: Optional[dict] = None, error: Optional[str] = None) -> Job:
        """End a job as succeeded, failed or cancelled (a job already ended keeps its status)."""
        if status not in ("succeeded", "failed", "cancelled"):
            raise InvalidInput(f"cannot finish a job as {status!r}")
        with self._tx() as db:
            db.execute("UPDATE jobs SET status = ?, result = ?, error = ?, finished = ?, "
                       "progress = CASE WHEN ? = 'succeeded' THEN 1 ELSE progress END "
                       "WHERE id = ? AND status IN ('queued', 'running')",
                       [status, dumps(result or {}), error, utcnow(), status, job_id])
        return self.get_job(job_id)

    def request_cancel(self, job_id: int) -> Job:
        """Cancel: a queued job ends at once, a running one is told to stop (its runner enforces it)."""
        job = self.get_job(job_id)
        if job.done:
            raise Conflict(f"job {job_id} already {job.status}")
        with self._tx() as db:
            db.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", [job_id])
            db.execute("UPDATE jobs SET status = 'cancelled', finished = ? WHERE id = ? AND status = 'queued'",
                       [utcnow(), job_id])
        return self.get_job(job_id)

    def requeue_job(self, job_id: int) -> Job:
        """Put an interrupted job back in the queue (it resumes from its checkpoint)."""
        with self._tx() as db:
            db.execute("UPDATE jobs SET status = 'queued', pid = NULL, phase = 'resuming' WHERE id = ?", [job_id])
        return self.get_job(job_id)

    def sweep_stale_jobs(self, is_alive: Callable[[Optional[int]], bool], stale_after_seconds: float,
                         resume: bool = False) -> list[Job]:
        """Jobs left 'running' by a dead process: failed as interrupted, or re-queued when ``resume``."""
        swept = []
        for row in self._all("SELECT * FROM jobs WHERE status = 'running'"):
            if is_alive(row["pid"]) and _age_seconds(row["heartbeat"]) < stale_after_seconds:
                continue
            if resume and row["checkpoint"]:
                swept.append(self.requeue_job(row["id"]))
            else:
                swept.append(self.finish_job(row["id"], "failed",
                                             error="interrupted: the job process died (server restart or crash)"))
        return swept

    def get_job(self, job_id: int) -> Job:
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            raise InvalidInput("job id must be an integer")
        row = self._one("SELECT * FROM jobs WHERE id = ?", [job_id])
        if row is None:
            raise NotFound(f"unknown job {job_id}")
        return Job.from_row(self._located(row, "checkpoint"))

    def list_jobs(self, agent: int | str | None = None, limit: int = 50) -> list[Job]:
        """Most recent jobs first."""
        if agent is None:
            rows = self._all("SELECT * FROM jobs ORDER BY id DESC LIMIT ?", [limit])
        else:
            rows = self._all("SELECT * FROM jobs WHERE agent_id = ? ORDER BY id DESC LIMIT ?",
                             [self.get_agent(agent).id, limit])
        return [Job.from_row(self._located(r, "checkpoint")) for r in rows]

    # ---- metrics and logs --------------------------------------------------------------------
    def log_metrics(self, job_id: int, step: int, metrics: dict) -> None:
        """One row per namespaced key (``reward/mean``, ``ppo/approx_kl``...) in one transaction."""
        now = utcnow()
        with self._tx() as db:
            for key, value in metrics.items():
                value = None if value is None or not math.isfinite(float(value)) else float(value)
                self._insert(db, "job_metrics", {"job_id": job_id, "step": int(step), "key": key, "value": value,
                                                 "created": now})

    def job_metrics(self, job_id: int) -> list[dict]:
        """All metric rows of a job: dicts with step, key, value."""
        return self._all("SELECT step, key, value, created FROM job_metrics WHERE job_id = ? ORDER BY id", [job_id])

    def log_job(self, job_id: int, line: str, level: str = "info") -> None:
        """Append a line to a job's log."""
        with self._tx() as db:
            self._insert(db, "job_logs", {"job_id": job_id, "level": level, "line": str(line)[:4000],
                                          "created": utcnow()})

    def job_log_tail(self, job_id: int, n: int = 50) -> list[dict]:
        rows = self._all("SELECT level, line, created FROM job_logs WHERE job_id = ? ORDER BY id DESC LIMIT ?",
                         [job_id, n])
        return rows[::-1]

    # ---- reward models -----------------------------------------------------------------------
    def register_reward_model(self, agent: int | str, path: str, mode: str, data_snapshot: dict,
                              config: dict, metrics: dict, job_id: Optional[int] = None) -> RewardModel:
        """Record a trained reward model (its directory must already be complete)."""
        agent_id = self.get_agent(agent).id
        with self._tx() as db:
            rm_id = self._insert(db, "reward_models", {
                "agent_id": agent_id, "path": self._stored_path(path), "mode": mode, "data_snapshot": dumps(data_snapshot),
                "config": dumps(config), "metrics": dumps(metrics), "job_id": job_id, "created": utcnow()})
        return self.get_reward_model(rm_id)

    def get_reward_model(self, reward_model_id: int) -> RewardModel:
        row = self._one("SELECT * FROM reward_models WHERE id = ?", [reward_model_id])
        if row is None:
            raise NotFound(f"unknown reward model {reward_model_id}")
        return RewardModel.from_row(self._located(row, "path"))

    def list_reward_models(self, agent: int | str | None = None) -> list[RewardModel]:
        """Reward models, newest first."""
        if agent is None:
            rows = self._all("SELECT * FROM reward_models ORDER BY id DESC")
        else:
            rows = self._all("SELECT * FROM reward_models WHERE agent_id = ? ORDER BY id DESC",
                             [self.get_agent(agent).id])
        return [RewardModel.from_row(self._located(r, "path")) for r in rows]

    # ---- scheduler rules ---------------------------------------------------------------------
    def get_scheduler_rule(self, agent: int | str) -> Optional[dict]:
        """The stored trigger rule of an agent, or None when it has none yet."""
        return self._one("SELECT * FROM scheduler_rules WHERE agent_id = ?", [self.get_agent(agent).id])

    def set_scheduler_rule(self, agent: int | str, enabled: bool, min_new_feedback: int,
                           min_interval_minutes: float, cron: str = "") -> dict:
        """Store an agent's trigger rule (survives restarts)."""
        if isinstance(min_new_feedback, bool) or not isinstance(min_new_feedback, int) or min_new_feedback < 1:
            raise InvalidInput("min_new_feedback must be a positive integer")
        if not isinstance(min_interval_minutes, (int, float)) or not math.isfinite(min_interval_minutes) \
                or min_interval_minutes < 0:
            raise InvalidInput("min_interval_minutes must be a number >= 0")
        agent_id = self.get_agent(agent).id
        with self._tx() as db:
            db.execute("INSERT INTO scheduler_rules (agent_id, enabled, min_new_feedback, min_interval_minutes, cron, "
                       "updated) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(agent_id) DO UPDATE SET enabled = excluded.enabled, "
                       "min_new_feedback = excluded.min_new_feedback, min_interval_minutes = "
                       "excluded.min_interval_minutes, cron = excluded.cron, updated = excluded.updated",
                       [agent_id, int(bool(enabled)), min_new_feedback, float(min_interval_minutes), cron or "",
                        utcnow()])
        return self.get_scheduler_rule(agent_id)

    # ---- eval samples ------------------------------------------------------------------------
    def record_eval_samples(self, policy_id: int, samples: list[dict]) -> None:
        """Store a version's replies to the fixed eval prompts (replacing earlier ones)."""
        self.get_policy(policy_id)
        now = utcnow()
        with self._tx() as db:
            db.execute("DELETE FROM eval_samples WHERE policy_id = ?", [policy_id])
            for i, s in enumerate(samples):
                self._insert(db, "eval_samples", {
                    "policy_id": policy_id, "prompt_index": int(s.get("prompt_index", i)),
                    "prompt": dumps(s["prompt"]), "reply": s["reply"], "reward": s.get("reward"), "created": now})

    def eval_samples(self, policy_id: int) -> list[dict]:
        rows = self._all("SELECT prompt_index, prompt, reply, reward FROM eval_samples WHERE policy_id = ? "
                         "ORDER BY prompt_index", [policy_id])
        for r in rows:
            r["prompt"] = json.loads(r["prompt"])
        return rows
