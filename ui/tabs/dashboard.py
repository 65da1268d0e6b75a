"""Dashboard tab: every version of an agent with its metrics and ratings, curves, eval replies, admin actions.

Read-only for annotators; promote / roll back / archive / regenerate need the admin role (everyone is
admin in single-user local mode). Everything shown is read from the Store and refreshed by a timer.
"""
from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Optional

import gradio as gr

from rlhf.interop.hub import HubError, zip_version
from ui import charts
from ui.views.dashboard import (curve_series, default_curve_keys, job_choices, mean_eval_reward, metric_keys,
                                rating_rows, rollback_target, side_by_side, version_choices, versions_table,
                                volume_bins)
from ui.views.arena import BT_VS_ELO
from ui.views.text import missing, version_label
from ui.permissions import is_admin, require_admin
from ui.services import Services, bind
from ui.tabs.decisions import build_decisions_panel
from ui.tabs.errors import handles_errors

REFRESH_SECONDS = 10
ADMIN_NOTE = "Admin actions change which version the agent serves and what the arena offers; each asks first."
VIEW_ONLY = "You can view the dashboard; promoting, rolling back and archiving need the admin role."


# ---- read handlers ---------------------------------------------------------------------------------
def _keep(current, choices: list[tuple[str, int]], fallback=None):
    ids = [c[1] for c in choices]
    return current if current in ids else (fallback if fallback in ids else (ids[0] if ids else None))


def refresh_overview(services: Services, agent_name: str, pick_a, pick_b, pick_admin, pick_job):
    """Versions table, rating and feedback charts, and every version/job picker (keeping the picks)."""
    store = services.store
    policies = store.list_policies(agent_name)
    table = services.leaderboards.table(agent_name, with_text=False)
    reward_models = {rm.id: rm for rm in store.list_reward_models(agent_name)}
    scored = {p.id: mean_eval_reward(store.eval_samples(p.id)) for p in policies
              if missing((p.metrics or {}).get("eval/reward"))}  # the base: its stored eval replies' scores
    versions = versions_table(policies, reward_models, table, scored)
    ratings = charts.interval_chart(rating_rows(table))
    labels, stacks, caption = volume_bins(store.feedback_volume(agent_name, per="minute"),
                                                datetime.now(timezone.utc))
    volume = charts.bar_chart(labels, stacks, "ratings + votes", caption)
    choices = version_choices(policies)
    active = store.active_policy(agent_name).id
    newest_other = next((c[1] for c in choices if c[1] != active), None)
    jobs = job_choices(store.list_jobs(agent_name))
    a = _keep(pick_a, choices, active)
    b = _keep(pick_b, choices, newest_other)
    if b == a:  # one version against itself says nothing: the other side moves to the newest other version
        b = next((c[1] for c in choices if c[1] != a), b)
    return (versions, ratings, volume,
            gr.Dropdown(choices=choices, value=a),
            gr.Dropdown(choices=choices, value=b),
            gr.Dropdown(choices=choices, value=_keep(pick_admin, choices, newest_other)),
            gr.Dropdown(choices=jobs, value=_keep(pick_job, jobs)))


def first_paint(services: Services, agent_name: str):
    """The overview with default picks (on load and when another agent is chosen)."""
    return refresh_overview(services, agent_name, None, None, None, None)


def show_curves(services: Services, job_id, keys):
    """Training curves of one job for the chosen metric keys (defaults: mean reward and KL), one panel each."""
    if job_id is None:
        return charts.small_multiples({}), gr.Dropdown(choices=[], value=[], multiselect=True)
    rows = services.store.job_metrics(int(job_id))
    available = metric_keys(rows)
    chosen = [k for k in (keys or []) if k in available] or default_curve_keys(available)
    return (charts.small_multiples(curve_series(rows, chosen)),
            gr.Dropdown(choices=available, value=chosen, multiselect=True))


def show_side_by_side(services: Services, policy_a, policy_b):
    """Two versions' stored replies to the eval prompts, in two columns with reward-model scores."""
    store = services.store
    if policy_a is None or policy_b is None:
        return side_by_side([], [], "A", "B")
    a, b = store.get_policy(int(policy_a)), store.get_policy(int(policy_b))
    return side_by_side(store.eval_samples(a.id), store.eval_samples(b.id), version_label(a),
                              version_label(b))


def admin_access(services: Services, request: gr.Request):
    """Admin buttons are active for admins only."""
    allowed = is_admin(services, request)
    return (*[gr.Button(interactive=allowed) for _ in range(5)], ADMIN_NOTE if allowed else VIEW_ONLY)


# ---- admin handlers --------------------------------------------------------------------------------
@handles_errors()
def _admin_action(services: Services, request, action) -> str:
    require_admin(services, request)
    return action()


def promote_version(services: Services, policy_id, request: gr.Request) -> str:
    """Make the picked version the agent's active one."""
    def act():
        if policy_id is None:
            return "Pick a version first."
        p = services.store.promote_policy(int(policy_id))
        return f"{version_label(p)} is now the active version."
    return _admin_action(services, request, act)


def rollback_version(services: Services, agent_name: str, request: gr.Request) -> str:
    """Promote the active version's parent (else the newest older usable version)."""
    def act():
        target = rollback_target(services.store.list_policies(agent_name))
        if target is None:
            return "Nothing to roll back to: the active version has no usable older version."
        p = services.store.promote_policy(target.id)
        return f"Rolled back: {version_label(p)} is now the active version."
    return _admin_action(services, request, act)


def archive_version(services: Services, policy_id, request: gr.Request) -> str:
    """Retire the picked version (kept for history, no longer served or shown in the arena)."""
    def act():
        if policy_id is None:
            return "Pick a version first."
        p = services.store.archive_policy(int(policy_id))
        return f"{version_label(p)} is archived."
    return _admin_action(services, request, act)


ACTIONS = ("promote", "rollback", "archive")


def confirm_text(services: Services, action: str, agent_name: str, policy_id) -> Optional[str]:
    """What an admin action will change, asked before it runs; None when there is nothing to ask about."""
    store = services.store
    active = store.active_policy(agent_name)
    if action == "rollback":
        target = rollback_target(store.list_policies(agent_name))
        if target is None:
            return None
        return (f"**Roll back to {version_label(target)}?** It becomes the version everyone chats with and the "
                f"arena compares against; {version_label(active)} (active now) stays as a candidate.")
    if policy_id is None:
        return None
    p = store.get_policy(int(policy_id))
    if action == "archive" and p.id == active.id:
        return None
    if action == "promote":
        if p.id == active.id:
            return None
        return (f"**Promote {version_label(p)}?** It becomes the version everyone chats with and the arena "
                f"compares against; {version_label(active)} (active now) stays as a candidate.")
    return (f"**Archive {version_label(p)}?** It is no longer served, offered in the arena or asked about in "
            "the vote queue; its data stays (promote it to bring it back).")


@handles_errors(lambda status: (*dismiss(), status), warn=False)
def ask(services: Services, action: str, agent_name: str, policy_id, request: gr.Request = None):
    """Show the confirmation of ``action`` (the matching "Yes" button), or say why there is nothing to do."""
    hidden = dismiss()
    if not is_admin(services, request):
        return (*hidden, VIEW_ONLY)
    text = confirm_text(services, action, agent_name, policy_id)
    if text is None:
        why = {"rollback": "Nothing to roll back to: the active version has no usable older version.",
               "promote": "Pick a version that is not the active one."}.get(action, "Pick a version first.")
        if action == "archive" and policy_id is not None:
            why = ("That is the active version: everyone chats with it, so it cannot be archived. Promote (or roll "
                   "back to) another version first, then archive this one.")
        return (*hidden, why)
    return (gr.Group(visible=True), text, *[gr.Button(visible=a == action) for a in ACTIONS], gr.skip())


def dismiss():
    """Hide the confirmation (cancelled, done, or the pick changed under it)."""
    return (gr.Group(visible=False), "", *[gr.Button(visible=False) for _ in ACTIONS])


def regenerate_eval(services: Services, agent_name: str, policy_id, request: gr.Request) -> str:
    """Queue a job that writes the version's replies to the eval prompts again."""
    def act():
        if policy_id is None:
            return "Pick a version first."
        policy = services.store.get_policy(int(policy_id))
        job = services.scheduler.enqueue("eval_samples", agent_name, policy_id=policy.id, key=f"policy{policy.id}")
        return (f"Queued: job #{job.id} regenerates the eval replies of {version_label(policy)}; "
                "they appear here when it finishes.")
    return _admin_action(services, request, act)


# ---- download a version (issue 28) -----------------------------------------------------------------
@handles_errors(lambda status: (gr.DownloadButton(visible=False), status), warn=False, also=(HubError,))
def download_version(services: Services, policy_id, request: gr.Request = None):
    """The picked version as a zip (PEFT adapter naming its base by hub id + model card), for admins.

    Like the Data tab's exports it lies in a private directory that only admins can download from, deleted
    after the download or within ``ui.downloads.TTL`` seconds."""
    require_admin(services, request)
    if policy_id is None:
        return gr.DownloadButton(visible=False), "Pick a version first."
    path = services.downloads.offer(lambda work: zip_version(services.store, int(policy_id), work), "rlhf-version-")
    return (gr.DownloadButton(value=str(path), label=f"Download {path.name}", visible=True),
            f"{path.name}: load it with `PeftModel.from_pretrained(base, folder)`; its README.md is the model card.")


def build_version_download(services: Services, pick: gr.Dropdown) -> None:
    """A button that zips the version picked in ``pick`` and the download it then offers (admins)."""
    with gr.Row():
        prepare = gr.Button("Prepare download of this version (adapter + model card)", scale=2)
        file = gr.DownloadButton("Download", visible=False, scale=1)
    status = gr.Markdown()
    prepare.click(bind(download_version, services), [pick], [file, status], api_name="download_version")


# ---- layout ----------------------------------------------------------------------------------------
VERSION_WIDTHS = ["6%", "5%", "9%", "7%", "5%", "6%", "12%", "15%", "7%", "6%", "11%", "5%", "6%"]  # VERSION_COLUMNS


def build_dashboard(services: Services, tab: Optional[gr.Tab] = None) -> None:
    """Lay out the tab (inside ``with gr.Tab(...)``; pass it to refresh on select) and bind its handlers."""
    agents = [a.name for a in services.store.list_agents()]
    agent = gr.Dropdown(agents, value=agents[0], label="Agent")
    versions = gr.Dataframe(label="Versions (newest first) · missing values show as –", interactive=False,
                            wrap=True, column_widths=VERSION_WIDTHS)
    with gr.Row():
        with gr.Column():
            gr.Markdown("**Arena rating per version** (BT with its 95% interval; hollow: no interval yet)")
            ratings = gr.HTML(charts.empty_chart("Loading…"))
        with gr.Column():
            gr.Markdown("**Feedback volume** (ratings and votes per time bin)")
            volume = gr.HTML(charts.empty_chart("Loading…"))
    gr.Markdown(BT_VS_ELO)
    with gr.Accordion("Training curves", open=True):
        with gr.Row():
            job = gr.Dropdown([], label="Retrain job", scale=1)
            keys = gr.Dropdown([], multiselect=True, label="Metrics (one panel each)", scale=2)
        curves = gr.HTML(charts.small_multiples({}))
    pair = _side_by_side_layout()
    admin = _admin_layout(services)
    build_decisions_panel(services, agent)

    overview = bind(refresh_overview, services)
    overview_io = ([agent, pair.pick_a, pair.pick_b, admin.pick, job],
                   [versions, ratings, volume, pair.pick_a, pair.pick_b, admin.pick, job])
    curves_fn, pair_fn = bind(show_curves, services), bind(show_side_by_side, services)

    def then_details(dep):
        """After the overview: the curves and eval replies for the current picks."""
        dep.then(curves_fn, [job, keys], [curves, keys], api_name=False, show_progress="hidden") \
            .then(pair_fn, [pair.pick_a, pair.pick_b], [pair.samples], api_name=False, show_progress="hidden")

    then_details(gr.Timer(REFRESH_SECONDS).tick(overview, *overview_io, api_name=False, show_progress="hidden"))
    if tab is not None:  # a hidden tab's timer does not repaint it: refresh when it is shown
        then_details(tab.select(overview, *overview_io, api_name=False, show_progress="hidden"))
    # On load and on another agent: fresh picks (the old ones belong to the other agent).
    then_details(gr.on(None, bind(first_paint, services), [agent], overview_io[1], api_name=False))
    gr.on(None, bind(admin_access, services), [],
          [admin.promote, admin.rollback, admin.archive, pair.regen_a, pair.regen_b, admin.status], api_name=False)
    keys.input(curves_fn, [job, keys], [curves, keys], api_name=False)
    job.change(curves_fn, [job, keys], [curves, keys], api_name=False)
    for picker in (pair.pick_a, pair.pick_b):
        picker.change(pair_fn, [pair.pick_a, pair.pick_b], [pair.samples], api_name=False)
    regen_fn = bind(regenerate_eval, services)
    pair.regen_a.click(regen_fn, [agent, pair.pick_a], [pair.status], api_name="regenerate_eval_a")
    pair.regen_b.click(regen_fn, [agent, pair.pick_b], [pair.status], api_name="regenerate_eval_b")
    _bind_admin(services, agent, admin, lambda dep: dep.then(overview, *overview_io, api_name=False))


def _side_by_side_layout() -> SimpleNamespace:
    """Two versions' replies to the held-out eval prompts, and buttons to regenerate them."""
    with gr.Accordion("Side by side on the eval prompts", open=True):
        with gr.Row():
            pick_a = gr.Dropdown([], label="Version A")
            pick_b = gr.Dropdown([], label="Version B")
        with gr.Row():
            regen_a = gr.Button("Regenerate A's eval replies")
            regen_b = gr.Button("Regenerate B's eval replies")
        samples = gr.Dataframe(label="Replies to the held-out eval prompts (generated at publish time)",
                               interactive=False, wrap=True,
                               column_widths=["20%", "34%", "6%", "34%", "6%"])  # side_by_side's columns
        status = gr.Markdown()
    return SimpleNamespace(pick_a=pick_a, pick_b=pick_b, regen_a=regen_a, regen_b=regen_b, samples=samples,
                           status=status)


def _admin_layout(services: Services) -> SimpleNamespace:
    """Promote, roll back and archive (each asks first), and the version download."""
    with gr.Accordion("Admin", open=True):
        with gr.Row():
            pick = gr.Dropdown([], label="Version", scale=2)
            promote = gr.Button("Promote", variant="primary", scale=1)
            rollback = gr.Button("Roll back", scale=1)
            archive = gr.Button("Archive", variant="stop", scale=1)
        with gr.Group(visible=False) as confirm_box:
            confirm = gr.Markdown()
            with gr.Row():
                yes = [gr.Button(label, variant=variant, visible=False) for label, variant in
                       (("Yes, promote", "primary"), ("Yes, roll back", "primary"), ("Yes, archive", "stop"))]
                no = gr.Button("Cancel")
        status = gr.Markdown(ADMIN_NOTE)
        build_version_download(services, pick)
    return SimpleNamespace(pick=pick, promote=promote, rollback=rollback, archive=archive, confirm_box=confirm_box,
                           confirm=confirm, yes=yes, no=no, status=status)


def _bind_admin(services: Services, agent: gr.Dropdown, admin: SimpleNamespace, then_overview) -> None:
    """Each action asks first; the "Yes" runs it on the pick the question named (a new pick hides the question),
    then the overview repaints."""
    confirm_io = [admin.confirm_box, admin.confirm, *admin.yes]
    for button, action in zip((admin.promote, admin.rollback, admin.archive), ACTIONS):
        button.click(bind(ask, services, action), [agent, admin.pick], confirm_io + [admin.status], api_name=False)
    gr.on([admin.no.click, admin.pick.input, agent.change], dismiss, None, confirm_io, api_name=False)
    for button, fn, inputs, name in ((admin.yes[0], promote_version, [admin.pick], "promote"),
                                     (admin.yes[1], rollback_version, [agent], "rollback"),
                                     (admin.yes[2], archive_version, [admin.pick], "archive")):
        then_overview(button.click(bind(fn, services), inputs, [admin.status], api_name=name)
                      .then(dismiss, None, confirm_io, api_name=False))
