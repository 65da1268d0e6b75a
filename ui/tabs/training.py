"""Training tab: dry-run estimate + "Retrain now" (asked first), live job progress with time left, per-metric
curves, cancel (running jobs only), scheduler rules."""
from __future__ import annotations

import html
import re
from datetime import datetime, timezone
from typing import Optional

import gradio as gr
import pandas as pd

from rlhf.retrain.data import dry_run
from rlhf.retrain.triggers import Rule
from storage import Job
from ui import charts
from ui.views.dashboard import curve_series, rm_accuracy_text
from ui.permissions import require_admin
from ui.services import Services, bind
from ui.tabs.decisions import guard_html
from ui.tabs.errors import handles_errors

# The curves shown for a job, one panel each (one quantity per axis), in this order when logged.
CURVE_KEYS = ("reward/mean", "eval/reward", "ppo/kl", "eval/kl", "loss/policy", "loss/value", "reward/train_loss")


# ---- view logic (pure) -----------------------------------------------------------------------
def _seconds(job: Job, now: Optional[datetime] = None) -> Optional[float]:
    if not job.started:
        return None
    end = datetime.fromisoformat(job.finished) if job.finished else (now or datetime.now(timezone.utc))
    return max(0.0, (end - datetime.fromisoformat(job.started)).total_seconds())


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _duration(job: Job) -> str:
    seconds = _seconds(job)
    return "" if seconds is None else _clock(seconds)


MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>])")  # what CommonMark lets a backslash escape
RELIABLE_PROGRESS = 0.3  # below this the phases move unevenly: the pace so far says little about what is left


def time_left(job: Job, now: Optional[datetime] = None) -> str:
    """Elapsed time and an honest word on what is left for a running job: from its pace once it is
    ``RELIABLE_PROGRESS`` done; before that from the estimate made before it started, which holds only on a machine
    as quiet as then (past it, the estimate is said to be exceeded: never a countdown stuck at "1 min left").
    The pace is the one at the progress's last move, counted down from there: while the progress stands still the
    time left never grows, and once that countdown is spent the page says how long it has stood, and where."""
    elapsed = _seconds(job, now)
    if job.status != "running" or elapsed is None:
        return ""
    clock = f"{_clock(elapsed)} elapsed"
    if job.progress >= RELIABLE_PROGRESS:
        moved = min(elapsed, _seconds(job, datetime.fromisoformat(job.progressed))) if job.progressed else elapsed
        still = elapsed - moved
        left = moved * (1 - job.progress) / job.progress - still
        if left >= 30:
            return f"{clock} · about {max(1, round(left / 60))} min left at its pace so far"
        return (f"{clock} · {job.progress:.0%} done; the {job.phase} phase has not moved for {_clock(still)}, longer "
                f"than its pace so far allowed (a slow step or a busy machine); time left is known again when it moves")
    estimate = (job.config or {}).get("estimated_minutes")
    if estimate and elapsed < estimate * 60:
        return (f"{clock} · about {max(1, round(estimate - elapsed / 60))} min left if the machine stays as quiet "
                f"as when it was estimated (~{estimate:g} min in all)")
    if estimate:
        return (f"{clock} · past the ~{estimate:g} min estimate (the machine is busier than estimated); "
                f"time left known from {RELIABLE_PROGRESS:.0%} done")
    return f"{clock} · estimating the time left (known from {RELIABLE_PROGRESS:.0%} done)…"


def jobs_frame(jobs: list[Job]) -> pd.DataFrame:
    """Jobs as table rows, newest first."""
    rows = [{"job": j.id, "kind": j.kind, "status": j.status, "progress": f"{j.progress * 100:.0f}%",
             "phase": j.phase, "created": j.created[:19].replace("T", " "), "took": _duration(j),
             "new version": j.result.get("version", ""), "promoted": j.result.get("promoted", ""),
             "error": (j.error or "")[:80]} for j in jobs]
    return pd.DataFrame(rows, columns=["job", "kind", "status", "progress", "phase", "created", "took",
                                       "new version", "promoted", "error"])


def progress_html(job: Optional[Job]) -> str:
    """A progress bar with the job's phase and message."""
    if job is None:
        return "<p>No jobs yet.</p>"
    pct = job.progress * 100
    color = {"failed": "#d33", "cancelled": "#999", "succeeded": "#2a2"}.get(job.status, "#f80")
    detail = html.escape(job.error or job.message or "")
    gate = (job.result or {}).get("gate") if job.kind == "retrain" else None
    if gate:
        detail += (f"<br><b>Gate: {html.escape(str(gate.get('verdict')))}</b> — "
                   f"{html.escape(str(gate.get('reason', '')))}" + guard_html(gate))
    rm = ((job.result or {}).get("metrics") or {})
    cv = rm_accuracy_text({k: rm.get(f"reward_model/{k}") for k in ("cv_accuracy", "cv_low", "cv_high")})
    if cv:
        detail += f"<br>Reward model, cross-validated accuracy: {html.escape(cv)}"
    clock = time_left(job)
    state = "cancelling" if job.cancel_requested and not job.done else job.status
    return (f"<div><b>Job {job.id}</b> · {html.escape(job.kind)} · <b>{state}</b> · phase "
            f"<i>{html.escape(job.phase)}</i> · {pct:.0f}%" + (f" · {clock}" if clock else "") + "</div>"
            f"<div style='background:#eee;border-radius:4px;height:14px;margin:6px 0'>"
            f"<div style='width:{pct:.1f}%;background:{color};height:14px;border-radius:4px'></div></div>"
            f"<div style='font-size:90%'>{detail}</div>")


def job_choices(jobs: list[Job]) -> list[tuple[str, int]]:
    return [(f"#{j.id} {j.kind} · {j.status}", j.id) for j in jobs]


def curves_html(rows: list[dict]) -> str:
    """The job's curves, one panel per logged metric of ``CURVE_KEYS``."""
    present = {r["key"] for r in rows}
    return charts.small_multiples(curve_series(rows, [k for k in CURVE_KEYS if k in present]),
                                  empty="No curves yet: they appear as the job logs its steps.")


def estimate_markdown(estimate: dict) -> str:
    """The dry-run estimate shown before "Retrain now"."""
    text = (f"**Feedback:** {estimate['feedback_count']} ratings/comparisons · **pairs:** {estimate['pairs']} · "
            f"**rated replies:** {estimate['pointwise']} · **estimated time:** ~{estimate['estimated_minutes']} min "
            "on a quiet machine (longer while people chat or other jobs run)")
    if not estimate["ready"]:
        text += f"\n\n⚠️ Not enough data yet: need {estimate['missing']}."
    return text


def plain_markdown(text: str) -> str:
    """``text`` shown as itself in a ``gr.Markdown``: no HTML, no Markdown (engine status quotes recorded faults,
    which are data anyone with the data dir may have written)."""
    return MARKDOWN_PUNCTUATION.sub(r"\\\1", html.escape(str(text), quote=False))


# ---- handlers ---------------------------------------------------------------------------------
def refresh(services: Services, agent: str, job_id):
    """Everything the tab shows, re-read from the Store (Cancel only for a job that has not ended): the job picked
    by hand (``job_id``; the tab's ``pinned``), else the newest, so a job started anywhere (the Dashboard's *Retrain
    without them*, the scheduler) shows here as soon as it is queued."""
    store = services.store
    jobs = store.list_jobs(limit=30)
    estimate = _estimate(services, agent)
    estimate += f"\n\n**Serving engine:** {plain_markdown(services.server.engine_status)}"
    if services.scheduler is not None:  # how the cores are split between chat and a running job
        estimate += "\n\n" + services.scheduler.runner.budget.status()
    job = None
    if job_id not in (None, ""):
        job = next((j for j in jobs if j.id == int(job_id)), None)
    job = job or (jobs[0] if jobs else None)
    rows = store.job_metrics(job.id) if job else []
    log = "\n".join(r["line"] for r in store.job_log_tail(job.id, 15)) if job else ""
    choices = job_choices(jobs)
    nxt = services.triggers.next_check() if services.triggers else None
    sched = f"Next automatic check: {nxt:%Y-%m-%d %H:%M:%S} UTC" if nxt else "Scheduler not running."
    can_cancel = job is not None and not job.done and not job.cancel_requested
    return (estimate, jobs_frame(jobs), gr.Dropdown(choices=choices, value=job.id if job else None),
            progress_html(job), curves_html(rows), log, sched, gr.Button(interactive=can_cancel))


@handles_errors(warn=False)
def _estimate(services: Services, agent: str) -> str:
    """What a retrain of ``agent`` would use and take, or why it cannot be estimated."""
    return estimate_markdown(dry_run(services.store, services.config, agent))


@handles_errors(lambda status: (gr.Group(visible=False), "", status), warn=False)
def ask_retrain(services: Services, agent: str, request: gr.Request = None):
    """The question before a retrain: what it uses, how long it takes, what it changes for everyone."""
    require_admin(services, request)
    estimate = dry_run(services.store, services.config, agent)
    if not estimate["ready"]:
        return (gr.Group(visible=False), "", f"⚠️ Not enough data yet: need {estimate['missing']}.")
    text = (f"**Retrain {agent} now?** A new version is trained on {estimate['feedback_count']} ratings and votes "
            f"(about {estimate['estimated_minutes']} min if the machine is otherwise quiet, longer while people chat; "
            "chat slows down meanwhile). If it passes the gate it becomes the version everyone chats with.")
    return gr.Group(visible=True), text, ""


@handles_errors(lambda status: (status, gr.skip()), warn=False)
def retrain_now(services: Services, agent: str, request: gr.Request = None):
    """Enqueue a retrain (admins); the runner starts it in its own process. Returns the message and the job
    picker on the new job, so its progress shows at once."""
    require_admin(services, request)
    estimate = dry_run(services.store, services.config, agent)
    if not estimate["ready"]:
        return f"⚠️ Not enough data yet: need {estimate['missing']}.", gr.skip()
    job = services.scheduler.enqueue("retrain", agent, reason="manual", estimated_minutes=estimate["estimated_minutes"])
    picker = gr.Dropdown(choices=job_choices(services.store.list_jobs(limit=30)), value=job.id)
    return f"Retrain job #{job.id} is in the queue: its progress shows below.", picker


def pin(services: Services, job_id):
    """A job picked by hand stays shown; picking the newest job goes back to following whatever starts next."""
    jobs = services.store.list_jobs(limit=1)
    if job_id in (None, "") or (jobs and int(job_id) == jobs[0].id):
        return None
    return int(job_id)


@handles_errors(warn=False)
def cancel(services: Services, job_id, request: gr.Request = None):
    """Ask the job to stop (admins); the runner ends it at its next check."""
    require_admin(services, request)
    if job_id in (None, ""):
        return "Select a job first."
    job = services.store.request_cancel(int(job_id))
    services.scheduler.wake()
    return f"Cancel requested for job #{job.id}."


def load_rule(services: Services, agent: str):
    rule = services.triggers.rule(agent)
    return rule.enabled, rule.min_new_feedback, rule.min_interval_minutes, rule.cron


@handles_errors(warn=False, also=(ValueError, TypeError))
def save_rule(services: Services, agent: str, enabled: bool, threshold, interval, cron: str, request: gr.Request):
    """Store an agent's automatic-retrain rule (admins)."""
    require_admin(services, request)
    rule = services.triggers.update_rule(agent, Rule(bool(enabled), int(threshold), float(interval), cron or ""))
    state = "on" if rule.enabled else "off"
    return f"Saved: automatic retrain {state}, after {rule.min_new_feedback} new feedback, at most every " \
           f"{rule.min_interval_minutes:g} min" + (f", and on cron `{rule.cron}`" if rule.cron else "") + "."


# ---- layout -----------------------------------------------------------------------------------
def build_training(services: Services) -> None:
    """Lay out the Training tab and bind its handlers."""
    agents = [a.name for a in services.store.list_agents()]
    with gr.Row():
        agent = gr.Dropdown(agents, value=agents[0], label="Agent", scale=1)
        retrain = gr.Button("Retrain now", variant="primary", scale=1)
    with gr.Group(visible=False) as confirm_box:
        confirm = gr.Markdown()
        with gr.Row():
            yes = gr.Button("Yes, retrain", variant="primary")
            no = gr.Button("Cancel")
    estimate = gr.Markdown()
    status = gr.Markdown()
    with gr.Row():
        job_pick = gr.Dropdown(label="Job", choices=[], scale=2)
        cancel_btn = gr.Button("Cancel job", variant="stop", scale=1, interactive=False)
    progress = gr.HTML()
    curves = gr.HTML(charts.small_multiples({}, empty="No curves yet."))
    jobs = gr.Dataframe(label="Jobs", interactive=False, wrap=True)
    log = gr.Textbox(label="Log tail", lines=6, interactive=False)
    with gr.Accordion("Automatic retraining (scheduler)", open=False):
        with gr.Row():
            enabled = gr.Checkbox(label="Enabled")
            threshold = gr.Number(label="New feedback needed", precision=0, minimum=1)
            interval = gr.Number(label="At most every (minutes)", minimum=0)
            cron = gr.Textbox(label="Cron (optional, UTC)", placeholder="0 3 * * *")
        save = gr.Button("Save rule")
        rule_status = gr.Markdown()
        sched = gr.Markdown()

    outputs = [estimate, jobs, job_pick, progress, curves, log, sched, cancel_btn]
    refresh_fn = bind(refresh, services)
    pinned = gr.State(None)  # a job picked by hand; None: follow the newest job, wherever it was started
    gr.Timer(2).tick(refresh_fn, [agent, pinned], outputs, show_progress="hidden", api_name=False)
    agent.change(refresh_fn, [agent, pinned], outputs, api_name=False)
    agent.change(bind(load_rule, services), [agent], [enabled, threshold, interval, cron], api_name=False)
    retrain.click(bind(ask_retrain, services), [agent], [confirm_box, confirm, status], api_name=False)
    gr.on([no.click, agent.change], lambda: (gr.Group(visible=False), ""), None, [confirm_box, confirm],
          api_name=False)
    yes.click(bind(retrain_now, services), [agent], [status, job_pick], api_name="retrain") \
        .then(lambda: (gr.Group(visible=False), "", None), None, [confirm_box, confirm, pinned], api_name=False) \
        .then(refresh_fn, [agent, pinned], outputs, api_name=False)
    cancel_btn.click(bind(cancel, services), [job_pick], [status], api_name=False) \
        .then(refresh_fn, [agent, pinned], outputs, api_name=False)
    save.click(bind(save_rule, services), [agent, enabled, threshold, interval, cron], [rule_status],
               api_name=False)
    job_pick.input(bind(pin, services), [job_pick], [pinned], api_name=False) \
        .then(refresh_fn, [agent, pinned], outputs, api_name=False)
    rule_defaults = load_rule(services, agents[0])
    enabled.value, threshold.value, interval.value, cron.value = rule_defaults
