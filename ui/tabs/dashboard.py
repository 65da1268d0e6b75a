"""Dashboard tab: every version of an agent with its metrics and ratings, curves, eval replies, admin actions.

Read-only for annotators; promote / roll back / archive / regenerate need the admin role (everyone is
admin in single-user local mode). Everything shown is read from the Store and refreshed by a timer.
"""
from __future__ import annotations

from typing import Optional

import gradio as gr

from storage import StoreError
from ui import views
from ui.permissions import Forbidden, is_admin, require_admin
from ui.plots import by_color, keep_fresh
from ui.services import Services, bind
from ui.tabs.decisions import build_decisions_panel

REFRESH_SECONDS = 10
ADMIN_NOTE = "Admin actions change which version the agent serves and what the arena offers."
VIEW_ONLY = "You can view the dashboard; promoting, rolling back and archiving need the admin role."


# ---- read handlers ---------------------------------------------------------------------------------
def _keep(current, choices: list[tuple[str, int]], fallback=None):
    ids = [c[1] for c in choices]
    return current if current in ids else (fallback if fallback in ids else (ids[0] if ids else None))


def refresh_overview(services: Services, agent_name: str, pick_a, pick_b, pick_admin, pick_job):
    """Versions table, rating and feedback plots, and every version/job picker (keeping the picks)."""
    store = services.store
    policies = store.list_policies(agent_name)
    comparisons = store.list_comparisons(agent_name)
    table = views.board(comparisons, policies)
    reward_models = {rm.id: rm for rm in store.list_reward_models(agent_name)}
    versions = views.versions_table(policies, reward_models, table)
    ratings = views.rating_plot_frame(table)
    volume = views.volume_frame(store.feedback_volume(agent_name))
    choices = views.version_choices(policies)
    active = store.active_policy(agent_name).id
    newest_other = next((c[1] for c in choices if c[1] != active), None)
    jobs = views.job_choices(store.list_jobs(agent_name))
    return (versions,
            ratings,  # values only: keep_fresh sends the props that follow from them
            volume,
            gr.Dropdown(choices=choices, value=_keep(pick_a, choices, active)),
            gr.Dropdown(choices=choices, value=_keep(pick_b, choices, newest_other)),
            gr.Dropdown(choices=choices, value=_keep(pick_admin, choices, newest_other)),
            gr.Dropdown(choices=jobs, value=_keep(pick_job, jobs)))


def rating_plot_style(frame) -> dict:
    """The rating plot's props: one colour per version (CI bar and BT tick alike), the y range, one slot per version."""
    return {"color_map": views.rating_plot_colors(frame),
            "colors_in_legend": sorted({s for s in frame["series"] if " " not in s}),
            "y_lim": views.padded_limits(frame["rating"]), "x_lim": [-0.5, round(frame["x"].max()) + 0.5]}


def first_paint(services: Services, agent_name: str):
    """The overview with default picks (on load and when another agent is chosen)."""
    return refresh_overview(services, agent_name, None, None, None, None)


def show_curves(services: Services, job_id, keys):
    """Training curves of one job for the chosen metric keys (defaults: mean reward and KL)."""
    if job_id is None:
        return gr.LinePlot(value=views.curve_frame([], [])), gr.Dropdown(choices=[], value=[], multiselect=True)
    rows = services.store.job_metrics(int(job_id))
    available = views.metric_keys(rows)
    chosen = [k for k in (keys or []) if k in available] or views.default_curve_keys(available)
    return (gr.LinePlot(value=views.curve_frame(rows, chosen)),
            gr.Dropdown(choices=available, value=chosen, multiselect=True))


def show_side_by_side(services: Services, policy_a, policy_b):
    """Two versions' stored replies to the eval prompts, in two columns with reward-model scores."""
    store = services.store
    if policy_a is None or policy_b is None:
        return views.side_by_side([], [], "A", "B")
    a, b = store.get_policy(int(policy_a)), store.get_policy(int(policy_b))
    return views.side_by_side(store.eval_samples(a.id), store.eval_samples(b.id), views.version_label(a),
                              views.version_label(b))


def admin_access(services: Services, request: gr.Request):
    """Admin buttons are active for admins only."""
    allowed = is_admin(services, request)
    return (*[gr.Button(interactive=allowed) for _ in range(5)], ADMIN_NOTE if allowed else VIEW_ONLY)


# ---- admin handlers --------------------------------------------------------------------------------
def _admin_action(services: Services, request, action) -> str:
    try:
        require_admin(services, request)
        return action()
    except (Forbidden, StoreError) as exc:
        gr.Warning(str(exc))
        return f"⚠️ {exc}"


def promote_version(services: Services, policy_id, request: gr.Request) -> str:
    """Make the picked version the agent's active one."""
    def act():
        if policy_id is None:
            return "Pick a version first."
        p = services.store.promote_policy(int(policy_id))
        return f"{views.version_label(p)} is now the active version."
    return _admin_action(services, request, act)


def rollback_version(services: Services, agent_name: str, request: gr.Request) -> str:
    """Promote the active version's parent (else the newest older usable version)."""
    def act():
        target = views.rollback_target(services.store.list_policies(agent_name))
        if target is None:
            return "Nothing to roll back to: the active version has no usable older version."
        p = services.store.promote_policy(target.id)
        return f"Rolled back: {views.version_label(p)} is now the active version."
    return _admin_action(services, request, act)


def archive_version(services: Services, policy_id, request: gr.Request) -> str:
    """Retire the picked version (kept for history, no longer served or shown in the arena)."""
    def act():
        if policy_id is None:
            return "Pick a version first."
        p = services.store.archive_policy(int(policy_id))
        return f"{views.version_label(p)} is archived."
    return _admin_action(services, request, act)


def regenerate_eval(services: Services, agent_name: str, policy_id, request: gr.Request) -> str:
    """Queue a job that writes the version's replies to the eval prompts again."""
    def act():
        if policy_id is None:
            return "Pick a version first."
        policy = services.store.get_policy(int(policy_id))
        job = services.scheduler.enqueue("eval_samples", agent_name, policy_id=policy.id, key=f"policy{policy.id}")
        return (f"Queued: job #{job.id} regenerates the eval replies of {views.version_label(policy)}; "
                "they appear here when it finishes.")
    return _admin_action(services, request, act)


# ---- download a version (issue 28) -----------------------------------------------------------------
def download_version(services: Services, policy_id, request: gr.Request = None):
    """The picked version as a zip (PEFT adapter naming its base by hub id + model card), for admins.

    Like the Data tab's exports it lies in a private directory that only admins can download from, deleted
    after the download or within ``ui.downloads.TTL`` seconds."""
    from rlhf.interop.hub import HubError, zip_version
    from ui.downloads import DOWNLOADS

    work = None
    try:
        require_admin(services, request)
        if policy_id is None:
            return gr.DownloadButton(visible=False), "Pick a version first."
        work = DOWNLOADS.new_dir("rlhf-version-")
        path = zip_version(services.store, int(policy_id), work)
        DOWNLOADS.seal(work)
    except BaseException as exc:
        if work is not None:
            DOWNLOADS.remove(work)
        if not isinstance(exc, (Forbidden, StoreError, HubError)):
            raise
        return gr.DownloadButton(visible=False), f"⚠️ {exc}"
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
def build_dashboard(services: Services, tab: Optional[gr.Tab] = None) -> None:
    """Lay out the tab (inside ``with gr.Tab(...)``; pass it to refresh on select) and bind its handlers."""
    store = services.store
    agents = [a.name for a in store.list_agents()]
    agent = gr.Dropdown(agents, value=agents[0], label="Agent")
    versions = gr.Dataframe(label="Versions (newest first) · missing values show as –", interactive=False,
                            wrap=True)
    with gr.Row():
        ratings = gr.LinePlot(x="x", y="rating", color="series", title="Arena rating per version: BT tick, 95% CI bar",
                              x_title="version", y_title="rating (Elo scale)",
                              tooltip=["series", "point", "rating", "elo"], height=300)
        volume = gr.BarPlot(x="period", y="n", color="kind", title="Feedback volume", x_title="UTC time",
                            y_title="events", y_lim=[0, None], height=300, x_label_angle=-30)
    with gr.Accordion("Training curves", open=True):
        with gr.Row():
            job = gr.Dropdown([], label="Retrain job", scale=1)
            keys = gr.Dropdown([], multiselect=True, label="Metrics", scale=2)
        curves = gr.LinePlot(x="step", y="value", color="metric", title="Training curves", height=300)
    with gr.Accordion("Side by side on the eval prompts", open=True):
        with gr.Row():
            pick_a = gr.Dropdown([], label="Version A")
            pick_b = gr.Dropdown([], label="Version B")
        with gr.Row():
            regen_a = gr.Button("Regenerate A's eval replies")
            regen_b = gr.Button("Regenerate B's eval replies")
        samples = gr.Dataframe(label="Replies to the held-out eval prompts (generated at publish time)",
                               interactive=False, wrap=True,
                               column_widths=["20%", "34%", "6%", "34%", "6%"])  # views.side_by_side's columns
        regen_status = gr.Markdown()
    with gr.Accordion("Admin", open=True):
        with gr.Row():
            pick_admin = gr.Dropdown([], label="Version", scale=2)
            promote = gr.Button("Promote", variant="primary", scale=1)
            rollback = gr.Button("Roll back", scale=1)
            archive = gr.Button("Archive", variant="stop", scale=1)
        admin_status = gr.Markdown(ADMIN_NOTE)
        build_version_download(services, pick_admin)
    build_decisions_panel(services, agent)

    keep_fresh(ratings, rating_plot_style)
    keep_fresh(volume, lambda f: {**by_color("kind")(f), "sort": sorted(set(f["period"]))})
    keep_fresh(curves, by_color("metric"))
    overview = bind(refresh_overview, services)
    overview_io = ([agent, pick_a, pick_b, pick_admin, job],
                   [versions, ratings, volume, pick_a, pick_b, pick_admin, job])
    curves_fn, pair_fn = bind(show_curves, services), bind(show_side_by_side, services)

    def then_details(dep):
        """After the overview: the curves and eval replies for the current picks."""
        dep.then(curves_fn, [job, keys], [curves, keys], api_name=False, show_progress="hidden") \
            .then(pair_fn, [pick_a, pick_b], [samples], api_name=False, show_progress="hidden")

    then_details(gr.Timer(REFRESH_SECONDS).tick(overview, *overview_io, api_name=False, show_progress="hidden"))
    if tab is not None:  # a hidden tab's timer does not repaint it: refresh when it is shown
        then_details(tab.select(overview, *overview_io, api_name=False, show_progress="hidden"))
    # On load and on another agent: fresh picks (the old ones belong to the other agent).
    then_details(gr.on(None, bind(first_paint, services), [agent], overview_io[1], api_name=False))
    gr.on(None, bind(admin_access, services), [], [promote, rollback, archive, regen_a, regen_b, admin_status],
          api_name=False)
    keys.input(curves_fn, [job, keys], [curves, keys], api_name=False)
    job.change(curves_fn, [job, keys], [curves, keys], api_name=False)
    for picker in (pick_a, pick_b):
        picker.change(pair_fn, [pick_a, pick_b], [samples], api_name=False)

    regen_fn = bind(regenerate_eval, services)
    regen_a.click(regen_fn, [agent, pick_a], [regen_status], api_name="regenerate_eval_a")
    regen_b.click(regen_fn, [agent, pick_b], [regen_status], api_name="regenerate_eval_b")
    for button, fn, inputs, name in ((promote, promote_version, [pick_admin], "promote"),
                                     (rollback, rollback_version, [agent], "rollback"),
                                     (archive, archive_version, [pick_admin], "archive")):
        button.click(bind(fn, services), inputs, [admin_status], api_name=name) \
            .then(overview, *overview_io, api_name=False)
