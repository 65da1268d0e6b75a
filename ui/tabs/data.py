"""Data tab: the feedback as a filterable table, annotation quality with plots, and the admin tools
(exclude annotators, flagged replies, exports, agents, API tokens).

View logic lives in pure functions (tested without Gradio); the maths is in ``rlhf.analysis.quality``. The
components are laid out in ``ui.tabs.data_layout``; this module's handlers fill them and ``build_data_tab`` wires
them.
"""
from __future__ import annotations

from typing import Optional

import gradio as gr
import pandas as pd

from rlhf.analysis import quality
from rlhf.interop.export import ExportError, archive, default_name, export
from storage import NotFound
from ui import charts
from ui.flows import decisions as decisions_flow
from ui.permissions import current_user, is_admin, require_admin, sees_all_feedback
from ui.services import Services, bind
from ui.tabs.common import ask, hide_question
from ui.tabs.data_layout import ADMIN_NOTE, ALL, DataParts, layout_data
from ui.tabs.errors import handles_errors
from ui.views.text import literal_html

VIEW_ONLY = "You can browse your own feedback and quality stats; other annotators' feedback and stats, excluding " \
            "annotators, flagged replies and exports need the admin role."
FEEDBACK_COLUMNS = ["created", "annotator", "kind", "label", "flags", "note", "prompt", "reply", "ids", "excluded"]
PROMPT_CHARS, REPLY_CHARS, NOTE_CHARS = 70, 100, 200
WINNER_WORDS = {"a": "A better", "b": "B better", "tie": "tie", "both_bad": "both bad"}
NO_AGREEMENT = "no shared items"  # agreement needs items another annotator judged too
NO_SPEED = "needs 2+ items"


# ---- view logic (pure) -----------------------------------------------------------------------------
def _fmt(value, digits: int = 2, percent: bool = False) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "–"
    return f"{value * 100:.0f}%" if percent else f"{value:.{digits}f}"


def stats_view(stats: pd.DataFrame) -> pd.DataFrame:
    """The per-annotator table as shown: agreement in percent, seconds rounded, excluded as a mark; an empty
    figure says why it is empty."""
    agreement = [_fmt(v, percent=True) if n else NO_AGREEMENT for v, n in zip(stats["agreement"],
                                                                                stats["overlap_items"])]
    speed = [NO_SPEED if v is None or pd.isna(v) else _fmt(v, 1) for v in stats["median_seconds"]]
    view = pd.DataFrame({
        "annotator": stats["annotator"], "ratings": stats["ratings"], "votes": stats["votes"],
        "items": stats["items"], "overlapping items": stats["overlap_items"],
        "agreement with majority": agreement, "median s / item": speed,
        "excluded": ["yes" if v else "" for v in stats["excluded"]]})
    return view


def agreement_chart(stats: pd.DataFrame) -> str:
    """Agreement with the majority per annotator (%), for those with at least one compared judgement."""
    known = stats[stats["agreement"].notna()]
    return charts.bar_chart(list(known["annotator"]), {"agreement %": [float(v) * 100 for v in known["agreement"]]},
                            "% agreement", integer=False, y_max=100, height=240,
                            empty="No agreement yet: it needs items judged by two or more annotators.")


def speed_chart(stats: pd.DataFrame) -> str:
    """Median seconds per item per annotator (two or more items)."""
    known = stats[stats["median_seconds"].notna()]
    return charts.bar_chart(list(known["annotator"]), {"seconds per item": [float(v) for v in known["median_seconds"]]},
                            "seconds", integer=False, height=240,
                            empty="No timings yet: they need two or more items per annotator.")


def alpha_markdown(report: dict) -> str:
    """Krippendorff's alpha per kind of judgement, with how many overlapping items it rests on."""
    lines = ["**Inter-annotator agreement** (Krippendorff's alpha on items judged by two or more annotators; "
             "1 = perfect, 0 = chance, < 0 = systematic disagreement):"]
    for kind, label in (("thumbs", "thumbs"), ("scores", "1–5 scores"), ("votes", "pairwise votes")):
        r = report[kind]
        value = "–" if r["alpha"] is None else f"{r['alpha']:.3f}"
        note = ""
        if r["alpha"] is None:
            note = (" (too few overlapping items: it needs items judged by two or more annotators)" if r["units"] < 2
                    else " (too few overlapping items or no variation: everyone gave the same answer)")
        lines.append(f"- {label} ({r['metric']}): **{value}** on {r['units']} item(s){note}")
    return "\n".join(lines)


def _short(text, limit: int) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _label(row) -> str:
    if row["kind"] == "vote":
        return WINNER_WORDS.get(row["winner"], row["winner"])
    parts = []
    taken_back = str(row.get("withdrawn") or "").split(", ")  # a value taken back since: shown, never as live
    if row["thumb"] in (1, -1):
        parts.append(("👍" if row["thumb"] == 1 else "👎") + (" (withdrawn)" if "thumb" in taken_back else ""))
    if row["score"] is not None and not pd.isna(row["score"]):
        parts.append(f"{int(row['score'])}/5" + (" (withdrawn)" if "score" in taken_back else ""))
    return " ".join(parts)


def feedback_view(frame: pd.DataFrame, limit: int = 500) -> pd.DataFrame:
    """The newest ``limit`` rows of a feedback frame, readable at a glance: what was said about which reply."""
    rows = frame.head(limit)
    view = pd.DataFrame({
        "created": rows["created"].str.slice(0, 16).str.replace("T", " "),
        "annotator": rows["annotator"], "kind": rows["kind"],
        "label": [_label(r) for _, r in rows.iterrows()], "flags": rows["flags"],
        "note": [_short(v, NOTE_CHARS) for v in rows["note"]],
        "prompt": [_short(v, PROMPT_CHARS) for v in rows["prompt"]],
        "reply": [_short(v, REPLY_CHARS) for v in rows["reply"]],
        "ids": [f"#{int(a)}" + (f" vs #{int(b)}" if b is not None and not pd.isna(b) else "")
                for a, b in zip(rows["message_id"], rows["other_id"])],
        "excluded": rows["excluded"].map(lambda v: "yes" if v else "")}, columns=FEEDBACK_COLUMNS)
    return view.astype(object).where(view.notna(), "")


# ---- handlers --------------------------------------------------------------------------------------
def refresh_data(services: Services, agent: str, annotator: str, kind: str, flag: str, text: str,
                 request: gr.Request = None) -> dict:
    """Everything the tab shows for an agent, filtered, by part name (``data_layout.REFRESHED``): flagged replies
    only for admins, and other annotators' feedback events (flags, notes, prompts, replies) only for admins unless
    ``server.open_feedback``."""
    computed = services.feedback_stats.get(services.store.get_agent(agent).id)  # once per change, not per refresh
    frame, stats = computed.frame, computed.stats
    if not sees_all_feedback(services, request):
        frame = frame[frame["annotator"] == (current_user(services, request) or "")].reset_index(drop=True)
    stats = quality.own_stats(stats, current_user(services, request), is_admin(services, request))
    names = [ALL] + sorted(frame["annotator"].unique().tolist())
    shown = quality.filter_feedback(frame, annotator, kind, flag, text)
    flagged = computed.flagged if is_admin(services, request) else computed.flagged.iloc[0:0]  # admins' eyes only
    count = f"{len(shown)} of {len(frame)} feedback events" + (" (newest 500 shown)" if len(shown) > 500 else "")
    return {"table": feedback_view(shown), "count": count,
            "who": gr.Dropdown(choices=names, value=annotator if annotator in names else ALL),
            "stats": stats_view(stats), "agreement": agreement_chart(stats), "speed": speed_chart(stats),
            "alpha": alpha_markdown(computed.alpha), "flagged": flagged,
            "pick": gr.Dropdown(choices=[n for n in names if n not in (ALL, quality.ANONYMOUS)])}


@handles_errors()
def set_excluded(services: Services, name: Optional[str], excluded: bool, request: gr.Request = None) -> str:
    """Exclude an annotator's feedback from training (kept in the Store), or bring it back."""
    require_admin(services, request)
    if not name:
        return "Pick an annotator first."
    done = decisions_flow.set_excluded(services, name, excluded)
    reopened = decisions_flow.reopened_text(done["reopened"])
    reopened = f"\n\n**Decisions reopened:** {literal_html(reopened)}" if reopened else ""
    if done["excluded"]:
        return f"**{literal_html(done['name'])}** is excluded: their feedback stays stored but the next retrain, " \
               "exports, leaderboards and people's decisions skip it." + reopened
    return f"**{literal_html(done['name'])}** is included again in training." + reopened


@handles_errors(lambda status: (gr.DownloadButton(visible=False), status), also=(ExportError,))
def run_export(services: Services, agent: str, fmt: str, request: gr.Request = None):
    """Write an export of the agent's feedback and offer it as a download (a zip for directory formats).

    The file lies in a private directory (0700, files 0600) that only admins can download from; it is
    deleted after the download or within ``ui.downloads.TTL`` seconds.
    """
    require_admin(services, request)
    agent_id = services.store.get_agent(agent).id if agent else None

    def write(work):
        result = export(services.store, services.config, fmt, work / default_name(fmt, agent_id), agent)
        return result, archive(result, work)

    result, path = services.downloads.offer(write)
    counts = ", ".join(f"{v} {k}" for k, v in result.counts.items())
    minutes = max(1, round(services.downloads.ttl / 60))
    return (gr.DownloadButton(value=str(path), label=f"Download {path.name}", visible=True),
            f"Exported {counts}. The file is kept for {minutes} min or until downloaded.")


@handles_errors(lambda status: (status, gr.Textbox(value="", visible=False)), also=(ValueError,))
def make_token(services: Services, name: str, label: str, expires_in_days=None, request: gr.Request = None):
    """Create an API token for a user (optionally expiring after some days); it is shown once: (message, the token
    in a read-only box whose copy button copies exactly the token, no line around it)."""
    require_admin(services, request)
    name = (name or "").strip()
    if not name:
        return "Type the user's name first.", gr.Textbox(value="", visible=False)
    auth = services.auth
    if auth is not None and auth.mode == "users" and auth.role_for(name) is None:
        raise NotFound(f"{name!r} is not a configured user")
    days = None if expires_in_days in (None, "", 0) else float(expires_in_days)
    token = services.store.create_api_token(name, label or "", days)
    until = f" It expires in {days:g} day(s)." if days else ""
    return (f"Token for **{literal_html(name)}** below, shown only now: copy it with the box's copy button and send "
            f"it as `Authorization: Bearer <token>`.{until}", gr.Textbox(value=token, visible=True))


def token_table(services: Services, request: gr.Request = None) -> pd.DataFrame:
    """Every API token without its secret (admins only; others get an empty table)."""
    columns = ["id", "user", "label", "created", "expires", "state"]
    if not is_admin(services, request):
        return pd.DataFrame(columns=columns)
    rows = [{**t, "state": "revoked" if t["revoked"] else "expired" if t["expired"] else "active"}
            for t in services.store.list_api_tokens()]
    return pd.DataFrame(rows, columns=[*columns, "revoked", "expired"])[columns]


@handles_errors(lambda status: ask(None, status), warn=False, also=(ValueError,))
def ask_revoke(services: Services, token_id, request: gr.Request = None) -> tuple:
    """The question before revoking a token: whose it is and that it cannot be undone."""
    require_admin(services, request)
    if token_id in (None, ""):
        return ask(None, "Type the id of the token to revoke (see the table).")
    token_id = int(token_id)
    user = services.store.api_token_user(token_id)
    return ask(f"**Revoke token #{token_id} of {literal_html(user)}?** Every program that uses it is refused from "
               "the next request on, and a revoked token cannot be brought back (create a new one instead).")


@handles_errors(also=(ValueError,))
def revoke_token(services: Services, token_id, request: gr.Request = None) -> str:
    """Revoke an API token by id (admins): it stops working at once."""
    require_admin(services, request)
    if token_id in (None, ""):
        return "Type the id of the token to revoke (see the table)."
    token_id = int(token_id)
    user = services.store.api_token_user(token_id)
    services.store.revoke_api_token(token_id)
    return f"Token #{token_id} of **{literal_html(user)}** is revoked."


@handles_errors(lambda status: ask(None, status), warn=False)
def ask_exclude(services: Services, agent: str, name: Optional[str], request: gr.Request = None) -> tuple:
    """The question before excluding an annotator: how much of their feedback the next retrain leaves out."""
    require_admin(services, request)
    if not name:
        return ask(None, "Pick an annotator first.")
    rows = services.store.feedback_rows(services.store.get_agent(agent).id)
    ratings = sum(1 for r in rows["ratings"] if r["annotator"] == name)
    votes = sum(1 for c in rows["comparisons"] if c["annotator"] == name)
    return ask(f"**Exclude {literal_html(name)} from training?** Their {ratings} rating event(s) and {votes} vote(s) "
               f"on {literal_html(agent)} stay stored, but the next retrain and the training exports leave them out, "
               "for every agent; versions already trained on them are marked on the Dashboard. *Include again* "
               "undoes it.")


def admin_gate(services: Services, n_controls: int, request: gr.Request = None):
    """The access note, and the admin controls enabled for admins only."""
    allowed = is_admin(services, request)
    return (ADMIN_NOTE if allowed else VIEW_ONLY, *[gr.Button(interactive=allowed) for _ in range(n_controls)])


# ---- wiring ----------------------------------------------------------------------------------------
def build_data_tab(services: Services, tab: Optional[gr.Tab] = None) -> None:
    """Lay out the tab (inside ``with gr.Tab(...)``; pass it to refresh on select) and bind its handlers."""
    p = layout_data(services)
    refresh = p.keyed(bind(refresh_data, services))
    _wire_feedback(services, p, refresh, tab)
    _wire_exclusion(services, p, refresh)
    p.run.click(bind(run_export, services), [p.agent, p.fmt], [p.download, p.export_status], api_name="export")
    _wire_tokens(services, p)


def _wire_feedback(services: Services, p: DataParts, refresh, tab: Optional[gr.Tab]) -> None:
    """The table and the quality figures follow the filters, the tab being shown and the Store (every 30 s); the
    admin tools are enabled for admins only."""
    gr.on([p.agent.change, p.who.input, p.kind.change, p.flag.change, p.text.submit], refresh, p.filters,
          p.refreshed, api_name=False)
    gr.on(None, refresh, p.filters, p.refreshed, api_name=False)  # on load
    if tab is not None:  # what arrived since the last refresh, as soon as the tab is shown
        tab.select(refresh, p.filters, p.refreshed, api_name=False, show_progress="hidden")
    gr.Timer(30).tick(refresh, p.filters, p.refreshed, api_name=False, show_progress="hidden")
    p.agent.focus(lambda current: gr.Dropdown(choices=[a.name for a in services.store.list_agents()], value=current),
                  [p.agent], [p.agent], api_name=False)
    gr.on(None, bind(admin_gate, services, len(p.admin_only)), None, [p.access, *p.admin_only], api_name=False)


def _wire_exclusion(services: Services, p: DataParts, refresh) -> None:
    """Excluding asks first ("Yes" runs it; the API name stays on the "Yes" event); including does not."""
    question = p.exclude_question
    ask_out = [question.box, question.text, p.exclude_status]
    p.exclude.click(bind(ask_exclude, services), [p.agent, p.pick], ask_out, api_name=False)
    gr.on([p.pick.input, p.agent.change], hide_question, None, ask_out[:2], api_name=False)
    question.yes.click(bind(set_excluded, services), [p.pick, gr.State(True)], [p.exclude_status],
                       api_name="exclude_annotator") \
        .then(hide_question, None, ask_out[:2], api_name=False).then(refresh, p.filters, p.refreshed, api_name=False)
    p.include.click(bind(set_excluded, services), [p.pick, gr.State(False)], [p.exclude_status],
                    api_name="include_annotator") \
        .then(refresh, p.filters, p.refreshed, api_name=False)


def _wire_tokens(services: Services, p: DataParts) -> None:
    """API tokens: create one (shown once), revoke one after a question; the table follows."""
    list_tokens = bind(token_table, services)
    p.token_button.click(bind(make_token, services), [p.token_user, p.token_label, p.token_days],
                         [p.token_out, p.token_box], api_name=False).then(list_tokens, None, [p.tokens], api_name=False)
    question = p.revoke_question
    revoke_out = [question.box, question.text, p.token_out]
    p.revoke_button.click(bind(ask_revoke, services), [p.revoke_id], revoke_out, api_name=False)
    p.revoke_id.input(hide_question, None, revoke_out[:2], api_name=False)
    question.yes.click(bind(revoke_token, services), [p.revoke_id], [p.token_out], api_name=False) \
        .then(hide_question, None, revoke_out[:2], api_name=False).then(list_tokens, None, [p.tokens], api_name=False)
    gr.on(None, list_tokens, None, [p.tokens], api_name=False)  # on load
