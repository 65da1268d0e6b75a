"""The promotion panel (dashboard): open decisions people's votes settle, what the guard saw, and versions trained
on annotators excluded since (with a one-click retrain without them).

One function, ``build_decisions_panel(services, agent)``, lays it out inside the caller's tab; ``guard_html`` is
the guard's verdict for any place that shows a retrain's gate (the Training tab's progress box).
"""
from __future__ import annotations

import html
from typing import Optional

import gradio as gr

from ui.flows import decisions as flow
from ui.permissions import is_admin, require_admin
from ui.services import Services, bind
from ui.tabs.common import ask, build_question, hide_question
from ui.tabs.errors import handles_errors

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
    total = sum(d.get(k) or 0 for k in ("wins", "ties", "losses", "both_bad")) or d.get("counted_votes") or 0
    people = d.get("people", 0)  # accounts: the rule cannot tell one person's several accounts apart
    head = (f"**v{d['version']}** vs active v{d['opponent_version']}: {total} vote{'' if total == 1 else 's'} from "
            f"{people} account{'' if people == 1 else 's'} — ")
    if d.get("tally_hidden"):  # how the votes split, read before and after a vote, would tell how someone voted
        head += "how they split is for admins until the decision is made"
    else:
        counted = "" if not d["both_bad"] else f" ({d['votes']} count: both-bad votes say neither is better)"
        head += (f"{d['wins']} won, {d['ties']} tied, {d['losses']} lost, {d['both_bad']} both bad · win rate "
                 f"{_pct(d['win_rate'])} [{_pct(d['low'])}–{_pct(d['high'])}]{counted}")
    if d.get("uncounted_votes"):
        head += f" · {d['uncounted_votes']} votes not counted (the voter chose or saw the versions)"
    reopened = d.get("reopened") or {}
    if reopened and d.get("open"):
        head += f" · reopened: was '{reopened.get('previous')}' until {reopened.get('because')}"
    if d.get("awaiting_admin"):
        why = f" ({d['rule_reason']})" if d.get("rule_reason") else ""
        by = d.get("decided_by") or people
        return head + (f" · **decided by {by} accounts: {d['outcome']}** — waiting for an "
                       f"admin to promote or archive it{why}")
    why = ", ".join(d.get("guard_tripped") or []) or "the gate could not tell"
    more = f"about {d['votes_needed']} more votes"
    if d.get("people_needed"):
        more += f" from at least {d['people_needed']} more accounts"
    confirm = " · an admin confirms the outcome" if d.get("rule") == "ask" else ""
    return head + f" · {more} to decide{confirm} · sent to people because: {why}"


def decisions_markdown(rows: list[dict]) -> str:
    """Every open decision, newest first."""
    return "\n".join(f"- {decision_line(d)}" for d in rows) if rows else EMPTY


def tainted_markdown(rows: list[dict]) -> str:
    """Versions that learned from annotators excluded since."""
    if not rows:
        return ""
    return "**Trained on excluded annotators:**\n" + "\n".join(
        f"- v{r['version']} ({r['status']}) learned from {', '.join(r['tainted_by'])}" for r in rows)


@handles_errors(lambda status: (status, "", gr.update(choices=[], value=None)), warn=False)
def refresh_panel(services: Services, agent_name: str, current=None, request: gr.Request = None):
    """Open decisions (live tallies for admins), marked versions and the retrain picker's choices (keeping the pick
    while it is marked: a question asked about it must not change its subject under the admin's hand)."""
    rows = flow.open_decisions(services, agent_name, is_admin(services, request))
    marked = flow.tainted(services, agent_name)
    choices = [(f"v{r['version']}", r["policy_id"]) for r in marked]
    ids = [c[1] for c in choices]
    value = current if current in ids else (ids[0] if ids else None)
    return decisions_markdown(rows), tainted_markdown(marked), gr.update(choices=choices, value=value)


@handles_errors(lambda status: ask(None, status), warn=False)
def ask_retrain_without(services: Services, agent_name: str, policy_id, request: gr.Request = None) -> tuple:
    """The question before "Retrain without them": who is left out, what starts, how long it takes."""
    require_admin(services, request)
    if policy_id is None:
        return ask(None, "Pick a marked version first.")
    row = next((r for r in flow.tainted(services, agent_name) if r["policy_id"] == int(policy_id)), None)
    if row is None:
        return ask(None, "That version is no longer marked: pick another one.")
    who = ", ".join(row["tainted_by"])
    return ask(f"**Retrain without {html.escape(who)}?** A new retrain of {html.escape(agent_name)} starts now and "
               f"leaves their feedback out; it takes as long as any retrain (minutes to tens of minutes, longer while "
               f"people chat), and chat slows down meanwhile. v{row['version']} stays as it is: the new version "
               "replaces it only if it passes the gate.")


@handles_errors(warn=False)
def retrain_without(services: Services, policy_id, request: gr.Request) -> str:
    """Queue a retrain that leaves out the excluded annotators the picked version learned from."""
    require_admin(services, request)
    if policy_id is None:
        return "Pick a marked version first."
    out = flow.retrain_without(services, int(policy_id))
    return (f"Queued job #{out['job_id']}: retrain without {', '.join(out['without'])}, PPO from version id "
            f"{out['from_policy_id']}.")


def build_decisions_panel(services: Services, agent: gr.Dropdown) -> None:
    """The panel, inside the caller's layout; refreshed by its own timer and on another agent."""
    with gr.Accordion("Promotion decisions (people's votes)", open=True):
        open_md = gr.Markdown(EMPTY)
        marked_md = gr.Markdown()
        with gr.Row():
            pick = gr.Dropdown([], label="Marked version", scale=2)
            again = gr.Button("Retrain without them", scale=1)
        question = build_question("Yes, retrain without them", variant="primary")
        status = gr.Markdown()
    refresh = bind(refresh_panel, services)
    gr.Timer(REFRESH_SECONDS).tick(refresh, [agent, pick], [open_md, marked_md, pick], api_name=False,
                                   show_progress="hidden")
    gr.on(None, refresh, [agent], [open_md, marked_md, pick], api_name=False)  # on load and on another agent
    # It asks first: one click would start a job of many minutes that slows chat down for everyone.
    again.click(bind(ask_retrain_without, services), [agent, pick], [question.box, question.text, status],
                api_name=False)
    gr.on([pick.input, agent.change], hide_question, None, [question.box, question.text], api_name=False)
    question.yes.click(bind(retrain_without, services), [pick], [status], api_name="retrain_without") \
        .then(hide_question, None, [question.box, question.text], api_name=False)
