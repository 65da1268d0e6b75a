"""Wiring: config → Store → model service → UI + REST on one FastAPI server."""
from __future__ import annotations

import functools
import logging
import threading

import gradio as gr
import uvicorn
from fastapi import FastAPI
from starlette.middleware import Middleware
from starlette.routing import Mount

from rlhf.config import AppConfig
from rlhf.cpu import apply_torch_threads
from rlhf.retrain.decisions import settle
from rlhf.retrain.publish import check_adapters, clean_leftovers
from rlhf.retrain.triggers import RetrainTriggers
from rlhf.jobs.scheduler import StudioScheduler
from rlhf.vote_queue.refill import QueueRefill
from rlhf.serving.policy_server import PolicyServer, load_server
from storage import Store
from ui.app import build_ui
from ui.auth import Auth
from ui.throttles import RateLimiter
from ui.api.admin import build_admin_router
from ui.api.agents import build_agents_router
from ui.api.arena import build_arena_router
from ui.api.chat import build_chat_router
from ui.api.errors import install_error_handlers
from ui.api.jobs import build_jobs_router
from ui.api.middleware import body_size_guard
from ui.api.policies import build_policies_router
from ui.api.vote_queue import build_queue_router
from ui.downloads import AdminOnlyFiles, NoUploads, seal_upload_folder
from ui.request_guard import (GradioCalls, allowed_hosts, gradio_login, hide_gradio_api, install_security,
                              timer_events)
from ui.permissions import is_admin
from ui.services import Services

log = logging.getLogger(__name__)


def open_store(config: AppConfig) -> Store:
    """The Store under the config's data dir, with the default agent in place."""
    store = Store(config.db_path, max_text_chars=config.serving.max_message_chars)
    store.ensure_default_agent(config.base_model)
    return store


def build_services(config: AppConfig, server: PolicyServer | None = None) -> Services:
    """Store, model server and background machinery for one app process.

    At start: remove leftovers of an interrupted publish, mark versions whose adapter is gone as broken,
    sweep jobs a dead process left running, then start the background machinery (when
    ``scheduler.enabled``): the scheduler, and the vote queue's refill (``queue.refill``).
    """
    store = open_store(config)
    auth = Auth.from_config(config, store)  # before the model loads: a bad users file fails fast
    clean_leftovers(store, config)
    check_adapters(store)
    scheduler = StudioScheduler(store, config)
    scheduler.add_timer("decide", functools.partial(settle, store, config), config.gate.decision_check_seconds)
    triggers = RetrainTriggers(store, config, scheduler).install()  # each agent's threshold and cron rule
    budget = scheduler.runner.budget  # one CPU budget: the job runner reports jobs, serving engines follow it
    apply_torch_threads(budget.plan.serving_idle)  # this thread (model loading); the engine applies its own
    server = server or load_server(config, [a.system_prompt for a in store.list_agents()])
    server.use_budget(budget)
    log.info("%s", budget.plan.describe())
    services = Services(config=config, store=store, server=server, scheduler=scheduler, triggers=triggers, auth=auth)
    if config.scheduler.enabled:
        scheduler.start()
    else:
        scheduler.runner.sweep()
    if config.queue.refill and config.scheduler.enabled:  # the vote queue's generation and scoring (after chat)
        services.refill = QueueRefill(store, config, lambda agent: services.server_for(agent, load=False)).start()
    return services


def widen_thread_pool(config: AppConfig) -> None:
    """Blocking REST handlers run in anyio's worker threads (40 by default); give every reply the engine
    accepts (running + waiting) a thread, so a full server answers "busy" instead of making clients queue."""
    import anyio.to_thread

    limiter = anyio.to_thread.current_default_thread_limiter()
    limiter.total_tokens = max(limiter.total_tokens, config.serving.max_batch_size + config.serving.queue_size + 16)


def create_app(services: Services, ui: bool = True) -> FastAPI:
    """FastAPI app with the REST API under /api/v1 and the Gradio UI at / (``ui=False``: the REST API alone,
    the same routes and guards without the ~1.5 s Gradio build, for headless use and REST tests)."""
    app = FastAPI(title="RLHF Studio", docs_url="/api/v1/docs", openapi_url="/api/v1/openapi.json")
    install_error_handlers(app)
    body_size_guard(app, services.config.server.max_body_bytes)
    limiter = RateLimiter(services.config.server.rate_limit_per_minute)  # one per-user budget: REST and Gradio API
    install_security(app, services, limiter)  # added last = runs first: Host, Origin, CORS, /login, REST credentials
    app.router.on_startup.append(lambda: widen_thread_pool(services.config))
    app.include_router(build_agents_router(services))
    app.include_router(build_chat_router(services))
    app.include_router(build_arena_router(services))
    app.include_router(build_jobs_router(services))
    app.include_router(build_admin_router(services))
    app.include_router(build_queue_router(services))
    app.include_router(build_policies_router(services))
    if not ui:
        return app
    seal_upload_folder()  # before Gradio writes anything there: uploads and downloads stay owner-only
    demo = build_ui(services)
    demo.queue(default_concurrency_limit=None)
    hide_gradio_api(demo)  # REST is the API for scripts; the UI's events are the page's alone
    # No share links (we never call launch), no extra allowed_paths, uploads capped.
    app = gr.mount_gradio_app(app, demo, path="/", max_file_size=services.config.server.max_file_size,
                              allowed_paths=[], show_error=True, footer_links=[], auth=gradio_login(services),
                              auth_message="RLHF Studio: sign in with the name and password your admin gave you.")
    gradio_app = next(r.app for r in app.routes if isinstance(r, Mount))
    # Innermost in the Gradio app, where its sign-in cookie and the HF session are already readable.
    timer_limiter = RateLimiter(services.config.server.timer_rate_limit_per_minute)  # open pages tick on their own
    gradio_app.user_middleware.append(Middleware(GradioCalls, services=services, limiter=limiter,
                                                 timer_limiter=timer_limiter, timers=timer_events(demo)))
    gradio_app.user_middleware.append(Middleware(AdminOnlyFiles, may_download=lambda r: is_admin(services, r),
                                                 downloads=services.downloads))
    gradio_app.user_middleware.append(Middleware(NoUploads))
    return app


def serve(config: AppConfig) -> None:
    """Build everything and serve until interrupted."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.WARNING)  # it logs every queue poll at INFO
    services = build_services(config)
    app = create_app(services)
    if services.auth is None and config.server.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("listening on %s WITHOUT sign-in: anyone who can reach it is admin; set RLHF_USERS or "
                    "server.users_file for a team", config.server.host)
    if allowed_hosts(config, services.auth is None) is None and "*" not in config.server.allowed_hosts:
        log.warning("any Host header is accepted: list this server's names in server.allowed_hosts")
    # uvicorn re-raises SIGTERM/SIGINT once it has shut down, so code after run() (and atexit) may never run:
    # the private UI exports are deleted in the shutdown step, which always runs.
    app.router.on_shutdown.append(services.downloads.clear)
    app.router.on_shutdown.append(services.replies.cancel_all)
    print(f"RLHF Studio on http://{config.server.host}:{config.server.port}", flush=True)
    # proxy_headers off: uvicorn would believe X-Forwarded-For from any loopback peer; ui.forwarded applies
    # server.trusted_proxies instead.
    settings = uvicorn.Config(app, host=config.server.host, port=config.server.port, log_level="warning",
                              proxy_headers=False, timeout_graceful_shutdown=config.server.shutdown_seconds)
    try:
        StudioServer(settings, on_exit=services.replies.cancel_all).run()
    finally:
        services.close()


class StudioServer(uvicorn.Server):
    """uvicorn's server that, on SIGTERM/SIGINT, first cancels every reply still generating (none is stored), so the
    requests waiting for them end at once; any request still open ``server.shutdown_seconds`` later is dropped
    (uvicorn's ``timeout_graceful_shutdown``), so shutdown takes seconds, whatever clients do."""

    def __init__(self, config: uvicorn.Config, on_exit):
        super().__init__(config)
        self.on_exit = on_exit

    def handle_exit(self, sig, frame) -> None:
        # A signal handler runs between two bytecodes of the main thread: take no lock here, hand the work over.
        threading.Thread(target=self.on_exit, name="cancel-replies", daemon=True).start()
        super().handle_exit(sig, frame)
