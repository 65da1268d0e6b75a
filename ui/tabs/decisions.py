"""The promotion panel (dashboard): open decisions people's votes settle, what the guard saw, and versions trained
on annotators excluded since (with a one-click retrain without them).

One function, ``build_decisions_panel(services, agent)``, lays it out inside the caller's tab; ``guard_html`` is
the guard's verdict for any place that shows a retrain's gate (the Training tab's progress box).
"""
from __future__ import annotations

import html
from typing import Optional

import gradio as gr

from storage import StoreError
from ui.flows import decisions as flow
from ui.permissions import Forbidden, require_admin
from ui.services import Services, bind

REFRESH_SECONDS = 10
EMPTY = "No open decisions: every candidate was promoted, rejected or decided by people's votes."


def _pct(x) -> str:
    return "–" if x is None else f"{x:.0%}"


def guard_html(gate: Optional[dict]) -> str:
    """The guard's tripped checks and up to three example replies, or '' when nothing tripped."""
    guard = (gate or {}).get("guard") or {}
    if not guard.get("tripped"):
        return ""
    rows = "".join(f"<li><i>{html.escape(str(e.get('prompt', ''))[:120])}</i> → "
                   f"{html.escape(str(e.get('candidate', ''))[:240])}</li>" for e in guard.get("examples", [])[:3])
    return (f"<br><b>Reward-hacking guard tripped: {html.escape(', '.join(guard['tripped']))}</b> — not promoted "
            f"automatically; people's votes decide.<ul style='margin:2px 0'>{rows}</ul>")


def decision_line(d: dict) -> str:
    """One open decision in words: votes, win rate with its always-valid interval, and what happens next."""
    head = (f"**v{d['version']}** vs active v{d['opponent_version']}: {d['votes']} votes from {d.get('people', 0)} "
            f"people ({d['wins']} won, {d['ties']} tied, {d['losses']} lost, {d['both_bad']} both bad) · win rate "
            f"{_pct(d['win_rate'])} [{_pct(d['low'])}–{_pct(d['high'])}]")
    if d.get("uncounted_votes"):
        head += f" · {d['uncounted_votes']} votes not counted (the voter chose or saw the versions)"
    reopened = d.get("reopened") or {}
    if reopened and d.get("open"):
        head += f" · reopened: was '{reopened.get('previous')}' until {reopened.get('because')}"
    if d.get("awaiting_admin"):
        return head + f" · **decided: {d['outcome']}** — waiting for an admin to promote or archive it"
    why = ", ".join(d.get("guard_tripped") or []) or "the gate could not tell"
    more = f"about {d['votes_needed']} more votes"
    if d.get("people_needed"):
        more += f" from at least {d['people_needed']} more people"
    return head + f" · {more} to decide · sent to people because: {why}"


def decisions_markdown(rows: list[dict]) -> str:
    """Every open decision, newest first."""
    return "\n".join(f"- {decision_line(d)}" for d in rows) if rows else EMPTY


def tainted_markdown(rows: list[dict]) -> str:
    """Versions that learned from annotators excluded since."""
    if not rows:
        return ""
    return "**Trained on excluded annotators:**\n" + "\n".join(
        f"- v{r['version']} ({r['status']}) learned from {', '.join(r['tainted_by'])}" for r in rows)


def refresh_panel(services: Services, agent_name: str):
    """Open decisions, marked versions and the retrain picker's choices."""
    try:
        rows, marked = flow.open_decisions(services, agent_name), flow.tainted(services, agent_name)
    except StoreError as exc:
        return f"⚠️ {exc}", "", gr.update(choices=[], value=None)
    choices = [(f"v{r['version']}", r["policy_id"]) for r in marked]
    return decisions_markdown(rows), tainted_markdown(marked), gr.update(choices=choices,
                                                                          value=choices[0][1] if choices else None)


def retrain_without(services: Services, policy_id, request: gr.Request) -> str:
    """Queue a retrain that leaves out the excluded annotators the picked version learned from."""
    try:
        require_admin(services, request)
        if policy_id is None:
            return "Pick a marked version first."
        out = flow.retrain_without(services, int(policy_id))
        return (f"Queued job #{out['job_id']}: retrain without {', '.join(out['without'])}, PPO from version id "
                f"{out['from_policy_id']}.")
    except (Forbidden, StoreError) as exc:
        return f"⚠️ {exc}"


def build_decisions_panel(services: Services, agent: gr.Dropdown) -> None:
    """The panel, inside the caller's layout; refreshed by its own timer and on another agent."""
    with gr.Accordion("Promotion decisions (people's votes)", open=True):
        open_md = gr.Markdown(EMPTY)
        marked_md = gr.Markdown()
        with gr.Row():
            pick = gr.Dropdown([], label="Marked version", scale=2)
            again = gr.Button("Retrain without them", scale=1)
        status = gr.Markdown()
    refresh = bind(refresh_panel, services)
    gr.Timer(REFRESH_SECONDS).tick(refresh, [agent], [open_md, marked_md, pick], api_name=False,
                                   show_progress="hidden")
    gr.on(None, refresh, [agent], [open_md, marked_md, pick], api_name=False)  # on load and on another agent
    again.click(bind(retrain_without, services), [pick], [status], api_name="retrain_without")
