"""One server lookup: chat and the vote queue's refill find an agent's model server the same way."""
from __future__ import annotations

import dataclasses

from ui.webapp import build_services

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_the_refill_finds_the_app_server_for_a_shipped_name_under_a_hub_id_base(app_config, tiny_server):
    """A Space runs on the hub id; an agent made with the shipped name is the same model: chat serves it from the
    app's server, and the vote queue's refill must find that server too (it used to get None: no refill)."""
    config = dataclasses.replace(app_config, base_model=HUB_ID,
                                 scheduler=dataclasses.replace(app_config.scheduler, enabled=True),
                                 queue=dataclasses.replace(app_config.queue, refill=True))
    services = build_services(config, server=tiny_server)
    try:
        agent = services.store.create_agent("shipped-name", "Be brief.", "smollm2-135m-instruct")
        assert services.server_for(agent) is services.server  # chat
        assert services.refill.server_for(agent) is services.server  # the vote queue's refill
        assert services.servers == {}  # nothing loaded twice
    finally:
        services.refill.stop()
        services.scheduler.shutdown()
        services.store.close()


def test_the_refill_never_loads_a_model(services, tmp_path):
    other = services.store.create_agent("elsewhere", "x", str(tmp_path / "no-such-model"))
    assert services.server_for(other, load=False) is None and services.servers == {}
