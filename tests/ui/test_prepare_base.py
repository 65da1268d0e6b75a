"""A new agent whose base must be converted first (a local GGUF) is prepared by a job (issue 43): POST /agents answers
at once with "preparing", a chat says why it waits (409, naming the job) until the job is done, then the agent chats;
a base that cannot be converted fails in its job, and chats say why."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

pytestmark = pytest.mark.slow  # converts a model in a job process

HELLO = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model_dir, tmp_path_factory):
    from rlhf.serving.llama_cpp.convert import hf_to_gguf

    return hf_to_gguf(tiny_model_dir, tmp_path_factory.mktemp("gguf") / "tiny.gguf", weight_type="f32")


@pytest.fixture
def client(services):
    from ui.webapp import create_app

    with TestClient(create_app(services, ui=False)) as c:
        yield c


def test_a_gguf_base_is_prepared_by_a_job_and_chats_once_it_is_done(services, client, tiny_gguf):
    from rlhf.base_models import needs_conversion

    data = services.config.data_path
    r = client.post("/api/v1/agents", json={"name": "gg", "system_prompt": "", "base_model": str(tiny_gguf),
                                            "generation": {"max_new_tokens": 4}})
    assert r.status_code == 200 and r.json()["status"] == "preparing", r.text
    job_id = r.json()["prepare_job_id"]
    assert needs_conversion(str(tiny_gguf), data)  # the request converted nothing
    r = client.post("/api/v1/chat", json={"agent": "gg", "messages": HELLO})
    assert r.status_code == 409 and f"job #{job_id}" in r.json()["error"] and "being prepared" in r.json()["error"]
    assert services.store.get_job(job_id).status == "queued"  # the chat found the job: no second one
    assert [j.id for j in services.store.list_jobs("gg")] == [job_id]
    done = services.scheduler.runner.wait(job_id, timeout=600)
    assert done.status == "succeeded", done.error
    assert not needs_conversion(str(tiny_gguf), data) and done.result["model_dir"].startswith(str(data))
    [listed] = [a for a in client.get("/api/v1/agents").json() if a["name"] == "gg"]
    assert listed["status"] == "ready" and listed["prepare_job_id"] is None
    r = client.post("/api/v1/chat", json={"agent": "gg", "messages": HELLO})
    assert r.status_code == 200, r.text
    assert not (data / "tokenizers").exists()  # serving read the tokenizer the job saved, never built it again


def test_a_base_that_cannot_be_converted_fails_in_its_job_and_chats_say_why(services, client, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 64)  # a header and nothing behind it
    r = client.post("/api/v1/agents", json={"name": "broken", "system_prompt": "", "base_model": str(broken)})
    assert r.status_code == 200 and r.json()["status"] == "preparing"
    from ui.tabs import agents as agents_ui  # the Agents panel says the same in words

    _, status = agents_ui.save_agent(services, agents_ui.NEW, "broken2", "", str(broken), None, None, None, None)
    assert "being prepared in the background (job #" in status
    done = services.scheduler.runner.wait(r.json()["prepare_job_id"], timeout=300)
    assert done.status == "failed"
    [listed] = [a for a in client.get("/api/v1/agents").json() if a["name"] == "broken"]
    assert listed["status"] == "failed"
    r = client.post("/api/v1/chat", json={"agent": "broken", "messages": HELLO})
    assert r.status_code == 409 and "preparing its base model failed" in r.json()["error"]
    assert services.store.count("messages") == 0  # the refused chat stored nothing
