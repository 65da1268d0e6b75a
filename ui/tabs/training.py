"""Training tab: dry-run estimate + "Retrain now", live job progress with metric plots, cancel, scheduler rules."""
from __future__ import annotations

import html
from datetime import datetime, timezone
from typing import Optional

import gradio as gr
import pandas as pd

from rlhf.jobs.pipeline import dry_run
from rlhf.jobs.scheduler import Rule
from storage import Job, StoreError
from ui import views
from ui.permissions import Forbidden, require_admin
from ui.plots import by_color, keep_fresh
from ui.services import Services, bind
from ui.tabs.decisions import guard_html

PLOT_KEYS = {"reward": ["reward/mean", "eval/reward"], "kl": ["ppo/kl", "eval/kl"],
             "losses": ["loss/policy", "loss/value", "reward/train_loss"]}


# ---- view logic (pure) -----------------------------------------------------------------------
def _duration(job: Job) -> str:
    if not job.started:
        return ""
    end = datetime.fromisoformat(job.finished) if job.finished else datetime.now(timezone.utc)
    seconds = int((end - datetime.fromisoformat(job.started)).total_seconds())
    return f"{seconds // 60}m{seconds % 60:02d}s"


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
    cv = views.rm_accuracy_text({k: rm.get(f"reward_model/{k}") for k in ("cv_accuracy", "cv_low", "cv_high")})
    if cv:
        detail += f"<br>Reward model, cross-validated accuracy: {html.escape(cv)}"
    return (f"<div><b>Job {job.id}</b> · {html.escape(job.kind)} · <b>{job.status}</b> · phase "
            f"<i>{html.escape(job.phase)}</i> · {pct:.0f}%</div>"
            f"<div style='background:#eee;border-radius:4px;height:14px;margin:6px 0'>"
            f"<div style='width:{pct:.1f}%;background:{color};height:14px;border-radius:4px'></div></div>"
            f"<div style='font-size:90%'>{detail}</div>")


def metric_frame(rows: list[dict], keys: list[str]) -> pd.DataFrame:
    """Long-format (step, value, metric) rows of the chosen keys, for a line plot."""
    data = [{"step": r["step"], "value": r["value"], "metric": r["key"]} for r in rows
            if r["key"] in keys and r["value"] is not None]
    return pd.DataFrame(data, columns=["step", "value", "metric"])


def estimate_markdown(estimate: dict) -> str:
    """The dry-run estimate shown before "Retrain now"."""
    text = (f"**Feedback:** {estimate['feedback_count']} ratings/comparisons · **pairs:** {estimate['pairs']} · "
            f"**rated replies:** {estimate['pointwise']} · **estimated time:** ~{estimate['estimated_minutes']} min")
    if not estimate["ready"]:
        text += f"\n\n⚠️ Not enough data yet: need {estimate['missing']}."
    return text


# ---- handlers ---------------------------------------------------------------------------------
def refresh(services: Services, agent: str, job_id):
    """Everything the tab shows, re-read from the Store."""
    store = services.store
    jobs = store.list_jobs(limit=30)
    try:
        estimate = estimate_markdown(dry_run(store, services.config, agent))
    except StoreError as exc:
        estimate = f"⚠️ {exc}"
    if services.scheduler is not None:  # how the cores are split between chat and a running job
        estimate += "\n\n" + services.scheduler.runner.budget.status()
    job = None
    if job_id not in (None, ""):
        job = next((j for j in jobs if j.id == int(job_id)), None)
    job = job or (jobs[0] if jobs else None)
    rows = store.job_metrics(job.id) if job else []
    log = "\n".join(r["line"] for r in store.job_log_tail(job.id, 15)) if job else ""
    choices = [(f"#{j.id} {j.kind} · {j.status}", j.id) for j in jobs]
    nxt = services.scheduler.next_check() if services.scheduler else None
    sched = f"Next automatic check: {nxt:%Y-%m-%d %H:%M:%S} UTC" if nxt else "Scheduler not running."
    return (estimate, jobs_frame(jobs), gr.Dropdown(choices=choices, value=job.id if job else None),
            progress_html(job), *(metric_frame(rows, keys) for keys in PLOT_KEYS.values()), log, sched)


def retrain_now(services: Services, agent: str, request: gr.Request):
    """Enqueue a retrain (admins); the runner starts it in its own process."""
    try:
        require_admin(services, request)
        estimate = dry_run(services.store, services.config, agent)
        if not estimate["ready"]:
            return f"⚠️ Not enough data yet: need {estimate['missing']}."
        job = services.scheduler.enqueue("retrain", agent, reason="manual")
    except (Forbidden, StoreError) as exc:
        return f"⚠️ {exc}"
    return f"Retrain job #{job.id} queued ({job.status})."


def cancel(services: Services, job_id, request: gr.Request):
    try:
        require_admin(services, request)
        if job_id in (None, ""):
            return "Select a job first."
        job = services.store.request_cancel(int(job_id))
        services.scheduler.wake()
    except (Forbidden, StoreError) as exc:
        return f"⚠️ {exc}"
    return f"Cancel requested for job #{job.id}."


def load_rule(services: Services, agent: str):
    rule = services.scheduler.rule(agent)
    return rule.enabled, rule.min_new_feedback, rule.min_interval_minutes, rule.cron


def save_rule(services: Services, agent: str, enabled: bool, threshold, interval, cron: str, request: gr.Request):
    """Store an agent's automatic-retrain rule (admins)."""
    try:
        require_admin(services, request)
        rule = services.scheduler.update_rule(agent, Rule(bool(enabled), int(threshold), float(interval),
                                                          cron or ""))
    except (Forbidden, StoreError, ValueError, TypeError) as exc:
        return f"⚠️ {exc}"
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
    estimate = gr.Markdown()
    status = gr.Markdown()
    with gr.Row():
        job_pick = gr.Dropdown(label="Job", choices=[], scale=2)
        cancel_btn = gr.Button("Cancel job", variant="stop", scale=1)
    progress = gr.HTML()
    with gr.Row():
        plots = [gr.LinePlot(x="step", y="value", color="metric", title=title, height=240)
                 for title in ("Reward", "KL", "Losses")]
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

    for plot in plots:
        keep_fresh(plot, by_color("metric"))
    outputs = [estimate, jobs, job_pick, progress, *plots, log, sched]
    refresh_fn = bind(refresh, services)
    gr.Timer(2).tick(refresh_fn, [agent, job_pick], outputs, show_progress="hidden", api_name=False)
    agent.change(refresh_fn, [agent, job_pick], outputs, api_name=False)
    agent.change(bind(load_rule, services), [agent], [enabled, threshold, interval, cron], api_name=False)
    retrain.click(bind(retrain_now, services), [agent], [status], api_name="retrain")
    cancel_btn.click(bind(cancel, services), [job_pick], [status], api_name=False)
    save.click(bind(save_rule, services), [agent, enabled, threshold, interval, cron], [rule_status],
               api_name=False)
    job_pick.input(refresh_fn, [agent, job_pick], outputs, api_name=False)
    rule_defaults = load_rule(services, agents[0])
    enabled.value, threshold.value, interval.value, cron.value = rule_defaults
