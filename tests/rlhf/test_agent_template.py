"""An agent's own chat template (issue 43): checked before it is stored, stored with the agent, used by serving, by
the agent's jobs (their config carries it, with the agent's base) and saved with a version's tokenizer."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from rlhf.prompting import PLAIN_TEMPLATE, check_template, encode_prompt

# Marks each role, so a prompt shows which template made it.
TEMPLATE = ("{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<<assistant>>{% endif %}")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]


@pytest.mark.parametrize("bad, says", [
    ("{% for m in messages %}{{ m['content'] }}", "does not render"),
    ("{{ messages[0]['content'] }}", "leaves out"),
    ("{{ raise_exception('System role not supported') }}", "System role not supported"),
    ("{% for m in messages|reverse %}{{ m['content'] }}{% endfor %}", "leaves out (or reorders)"),
])
def test_a_template_that_cannot_render_a_chat_is_refused_with_the_reason(bad, says):
    assert check_template(TEMPLATE) == TEMPLATE and check_template(PLAIN_TEMPLATE) == PLAIN_TEMPLATE
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        check_template(bad)


def test_the_store_keeps_an_agents_template_and_empty_means_the_bases(store):
    agent = store.create_agent("marked", "", "tiny", chat_template=TEMPLATE)
    assert agent.chat_template == TEMPLATE and store.get_agent("assistant").chat_template is None
    assert store.update_agent("marked", system_prompt="x").chat_template == TEMPLATE  # None leaves it
    assert store.update_agent("marked", chat_template="  ").chat_template is None  # blank: back to the base's
    assert store.create_agent("blank", "", "tiny", chat_template="").chat_template is None


def test_serving_the_jobs_tokenizer_and_a_versions_tokenizer_encode_with_the_agents_template(tiny_server,
                                                                                             tiny_model_dir,
                                                                                             tmp_path):
    from transformers import AutoTokenizer

    from rlhf.base_models import load_tokenizer
    from rlhf.retrain.bundle import add_tokenizer

    served = tiny_server.build_prompt("Be brief.", CHAT[1:], template=TEMPLATE)
    text = tiny_server.tokenizer.decode(served)
    assert "<<system>>Be brief.\n<<user>>hello there\n" in text and text.endswith("<<assistant>>")
    assert served != tiny_server.build_prompt("Be brief.", CHAT[1:])  # without it: the base's own template
    assert tiny_server.shared_prefix_len("Be brief.", served, TEMPLATE) > 0  # the system prefix, templated alike
    job_tokenizer = load_tokenizer(str(tiny_model_dir), TEMPLATE)  # what the retrain's phases encode with
    assert encode_prompt(job_tokenizer, CHAT, tiny_server.max_context_tokens) == served
    add_tokenizer(tmp_path, str(tiny_model_dir), TEMPLATE)
    version = AutoTokenizer.from_pretrained(str(tmp_path))
    assert list(version.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"]) == served


def test_an_agents_jobs_carry_its_base_and_template_unless_the_job_names_them(store, app_config):
    from rlhf.jobs.scheduler import StudioScheduler

    store.create_agent("other", "", "/models/another-base", chat_template=TEMPLATE)
    sched = StudioScheduler(store, app_config)
    job = sched.enqueue("retrain", "other")
    assert job.config["app"]["base_model"] == "/models/another-base"
    assert job.config["app"]["chat_template"] == TEMPLATE
    named = sched.enqueue("eval_samples", "other", overrides={"chat_template": PLAIN_TEMPLATE}, key="named")
    assert named.config["app"]["chat_template"] == PLAIN_TEMPLATE
    with pytest.raises(Exception, match="chat_template"):  # a job's own template is checked like the config's
        sched.enqueue("eval_samples", "other", overrides={"chat_template": "{% if %}"}, key="bad")


@pytest.fixture
def client(services):
    from ui.webapp import create_app

    with TestClient(create_app(services, ui=False)) as c:
        yield c


def test_rest_sets_and_clears_an_agents_template_and_refuses_one_that_cannot_render(services, client):
    r = client.post("/api/v1/agents", json={"name": "bad", "system_prompt": "s", "chat_template": "{{ oops"})
    assert r.status_code == 422 and "chat template" in r.json()["error"]
    assert [a.name for a in services.store.list_agents()] == ["assistant"]  # nothing stored
    r = client.post("/api/v1/agents", json={"name": "own", "system_prompt": "s", "chat_template": TEMPLATE})
    assert r.status_code == 200 and r.json()["chat_template"] == TEMPLATE
    r = client.patch("/api/v1/agents/own", json={"chat_template": "{{ messages[0]['content'] }}"})
    assert r.status_code == 422 and services.store.get_agent("own").chat_template == TEMPLATE  # unchanged
    r = client.patch("/api/v1/agents/own", json={"chat_template": ""})
    assert r.status_code == 200 and r.json()["chat_template"] is None
    assert services.store.get_agent("own").chat_template is None
