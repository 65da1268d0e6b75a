"""Data tab: view logic, handlers (admin gating, exclusion, export download, agents, tokens) and the REST twin."""
from __future__ import annotations

import zipfile
from pathlib import Path

import gradio as gr
import pytest
from fastapi.testclient import TestClient

from rlhf.analysis import quality
from tests.conftest import make_tiny_model
from ui.tabs import agents as agents_ui
from ui.tabs import data as data_tab
from ui.tabs import data_layout
from ui.auth import Auth

ADMIN, ANNOTATOR = gr.Request(username="alice"), gr.Request(username="bob")


@pytest.fixture
def rated(services):
    """Two conversations rated and voted on by alice, bob and carol."""
    store = services.store
    policy = store.active_policy("assistant").id
    for i in range(2):
        conv = store.create_conversation("assistant", "alice", messages=[{"role": "user", "content": f"q{i}"}])
        user = store.leaf(conv.id)
        a = store.record_reply(user.id, f"good {i}", policy)
        b = store.record_reply(user.id, f"bad {i}", policy)
        for who, thumb in (("alice", 1), ("bob", 1), ("carol", -1)):
            store.record_rating(a.id, who, thumb=thumb)
        store.record_rating(b.id, "carol", thumb=-1, flags=["Unsafe"])
        store.record_comparison(a.id, b.id, "a", "bob")
    return services


def team(services):
    services.auth = Auth(services.store, "users", {"alice": "admin", "bob": "annotator"})
    return services


def test_views_by_hand():
    stats = quality.annotator_stats({"conversations": [], "messages": [], "ratings": [], "comparisons": []})
    assert stats.empty and list(data_tab.stats_view(stats).columns)[0] == "annotator"
    report = {"thumbs": {"alpha": 0.5, "units": 3, "metric": "nominal"},
              "scores": {"alpha": None, "units": 0, "metric": "interval"},
              "votes": {"alpha": -0.25, "units": 2, "metric": "nominal"}}
    text = data_tab.alpha_markdown(report)
    assert "**0.500** on 3 item(s)" in text and "**–** on 0 item(s) (too few" in text and "**-0.250**" in text
    assert "judged by two or more annotators" in text  # an empty figure says why
    assert "No agreement yet" in data_tab.agreement_chart(stats) and "No timings yet" in data_tab.speed_chart(stats)


def test_refresh_shows_filtered_feedback_and_stats(rated):
    out = data_tab.refresh_data(rated, "assistant", "carol", "all", "all", "", None)
    assert tuple(out) == data_layout.REFRESHED  # by part name: the wiring keys it by component
    table, count, who, stats, agreement, speed, alpha, flagged, pick = out.values()
    assert set(table["annotator"]) == {"carol"} and count.startswith("4 of 10")
    assert who.value == "carol" and {"alice", "bob", "carol"} <= set(c[0] for c in who.choices)
    assert list(stats["annotator"]) == ["alice", "bob", "carol"]
    assert stats.set_index("annotator").loc["carol", "agreement with majority"] == "0%"
    assert ">carol</text>" in agreement and "thumbs (nominal)" in alpha
    assert list(table.columns) == data_tab.FEEDBACK_COLUMNS and set(table["label"]) == {"👎"}
    assert set(data_tab.refresh_data(rated, "assistant", "bob", "all", "all", "", None)["table"]["label"]) == \
        {"👍", "A better"}
    assert all(ids.startswith("#") for ids in table["ids"])
    assert len(flagged) == 2  # local mode: everyone is admin
    only_unsafe = data_tab.refresh_data(rated, "assistant", "all", "rating", "Unsafe", "", None)["table"]
    assert len(only_unsafe) == 2 and set(only_unsafe["flags"]) == {"Unsafe"}
    assert len(data_tab.refresh_data(rated, "assistant", "all", "all", "all", "GOOD 1", None)["table"]) == 4


def test_flagged_replies_and_admin_tools_need_admin(rated):
    team(rated)
    assert len(data_tab.refresh_data(rated, "assistant", "all", "all", "all", "", ANNOTATOR)["flagged"]) == 0
    assert len(data_tab.refresh_data(rated, "assistant", "all", "all", "all", "", ADMIN)["flagged"]) == 2
    assert "admin" in data_tab.set_excluded(rated, "carol", True, ANNOTATOR)
    box, question, status = data_tab.ask_exclude(rated, "assistant", "carol", ADMIN)
    assert box.visible and "Exclude carol from training?" in question and "rating event(s)" in question
    assert "admin" in data_tab.ask_exclude(rated, "assistant", "carol", ANNOTATOR)[2]
    assert not any(a.excluded for a in rated.store.list_annotators())  # asking changes nothing
    assert not any(a.excluded for a in rated.store.list_annotators())
    assert "excluded" in data_tab.set_excluded(rated, "carol", True, ADMIN)
    assert rated.store.feedback_rows("assistant")["excluded_annotators"] == ["carol"]
    assert "included again" in data_tab.set_excluded(rated, "carol", False, ADMIN)
    button, status = data_tab.run_export(rated, "assistant", "jsonl", ANNOTATOR)
    assert "admin" in status and button.visible is False
    assert "admin" in data_tab.make_token(rated, "bob", "", request=ANNOTATOR)[0]
    assert "not a configured user" in data_tab.make_token(rated, "zed", "", request=ADMIN)[0]
    made, box = data_tab.make_token(rated, "bob", "laptop", request=ADMIN)
    assert box.visible and box.value not in made  # the token is in its own box: its copy button copies it alone
    assert rated.store.token_owner(box.value) == "bob" and box.value == box.value.strip()
    note, *buttons = data_tab.admin_gate(rated, 3, ANNOTATOR)
    assert note == data_tab.VIEW_ONLY and all(b.interactive is False for b in buttons)


def test_export_download(rated):
    button, status = data_tab.run_export(rated, "assistant", "openrlhf", None)
    path = Path(button.value["path"])
    assert button.visible and path.suffix == ".zip" and "pairs" in status
    assert {"rm_pairs.jsonl", "prompts.jsonl", "LAUNCH.md"} <= set(zipfile.ZipFile(path).namelist())
    button, _ = data_tab.run_export(rated, "assistant", "kto", None)
    kto = Path(button.value["path"])
    assert kto.suffix == ".jsonl" and kto.read_text().count("\n") == 4


def test_agents_panel_creates_and_edits(services, tmp_path, tokenizer):
    dropdown, status = agents_ui.save_agent(services, agents_ui.NEW, "poet", "Answer in rhymes.", "", 32, 0.9, None)
    assert "Created agent **poet**" in status and dropdown.value == "poet"
    poet = services.store.get_agent("poet")
    assert poet.base_model == services.config.base_model and poet.generation == {"max_new_tokens": 32,
                                                                                 "temperature": 0.9}
    _, status = agents_ui.save_agent(services, "poet", "poet", "Answer in haiku.", "", None, None, 0.5, None)
    assert "Saved" in status and services.store.get_agent("poet").system_prompt == "Answer in haiku."
    _, status = agents_ui.save_agent(services, agents_ui.NEW, "bad", "x", "/no/such/model", None, None, None, None)
    assert status.startswith("⚠️") and "cannot find base model" in status
    _, status = agents_ui.save_agent(services, agents_ui.NEW, "hot", "x", "", None, 9.0, None, None)
    assert status.startswith("⚠️") and "temperature" in status
    name, prompt, base, *_ = agents_ui.load_agent(services, "poet")
    assert (name, prompt, base.interactive) == ("poet", "Answer in haiku.", False)
    _, status = agents_ui.save_agent(services, "poet", "poet", "Answer in haiku.", "", None, None, None, None,
                                     "Vote for the better *rhyme*.")
    assert "guidelines" in status and agents_ui.load_agent(services, "poet")[6] == "Vote for the better *rhyme*."
    own = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    _, status = agents_ui.save_agent(services, "poet", "poet", "Answer in haiku.", "", None, None, None, None,
                                     "Vote for the better *rhyme*.", "{% for m in messages %}")  # cannot render
    assert status.startswith("⚠️") and "chat template" in status
    assert services.store.get_agent("poet").chat_template is None
    agents_ui.save_agent(services, "poet", "poet", "Answer in haiku.", "", None, None, None, None,
                         "Vote for the better *rhyme*.", own)
    assert services.store.get_agent("poet").chat_template == own and agents_ui.load_agent(services, "poet")[7] == own
    agents_ui.save_agent(services, "poet", "poet", "Answer in haiku.", "", None, None, None, None,
                         "Vote for the better *rhyme*.", "")  # blank: back to the base model's
    assert services.store.get_agent("poet").chat_template is None
    from ui.tabs.common import guidelines_markdown
    assert guidelines_markdown(services, "poet") == "Vote for the better *rhyme*."
    assert "No guidelines" in guidelines_markdown(services, "assistant")
    team(services)
    _, status = agents_ui.save_agent(services, agents_ui.NEW, "sneaky", "x", "", None, None, None, ANNOTATOR)
    assert "admin" in status and "sneaky" not in [a.name for a in services.store.list_agents()]


@pytest.mark.slow  # seconds of real work: the full suite only (make test-fast < 60 s)
def test_rest_agents_quality_export_and_server_for(services, tmp_path, tokenizer):
    other = make_tiny_model(tmp_path / "other-base", tokenizer, seed=3)
    from ui.webapp import create_app

    with TestClient(create_app(services)) as client:
        made = client.post("/api/v1/agents", json={"name": "second", "system_prompt": "Be terse.",
                                                   "base_model": str(other), "generation": {"max_new_tokens": 8}})
        assert made.status_code == 200 and made.json()["base_model"] == str(other)
        assert client.post("/api/v1/agents", json={"name": "second", "system_prompt": "x"}).status_code == 409
        assert client.post("/api/v1/agents", json={"name": "z", "system_prompt": "x",
                                                   "generation": {"beam": 2}}).status_code == 422
        edited = client.patch("/api/v1/agents/second", json={"system_prompt": "Be kind."})
        assert edited.status_code == 200 and edited.json()["system_prompt"] == "Be kind."
        assert edited.json()["guidelines"] == ""
        guided = client.patch("/api/v1/agents/second", json={"guidelines": "Prefer *kind* replies."})
        assert guided.status_code == 200 and guided.json()["system_prompt"] == "Be kind."
        listed = {a["name"]: a for a in client.get("/api/v1/agents").json()}
        assert listed["second"]["guidelines"] == "Prefer *kind* replies." and listed["assistant"]["guidelines"] == ""
        assert client.patch("/api/v1/agents/second", json={"guidelines": 3}).status_code == 422
        reply = client.post("/api/v1/chat", json={"agent": "second", "annotator": "ann", "temperature": 0,
                                                  "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 200
        # The agent's own base model is served by its own server, loaded on first use.
        assert list(services.servers) == [str(other)] and services.server_for(services.store.get_agent("assistant")) \
            is services.server
        client.post("/api/v1/feedback", json={"message_id": reply.json()["message_id"], "thumb": -1,
                                              "flags": ["Unsafe"], "annotator": "ann"}).raise_for_status()
        q = client.get("/api/v1/quality", params={"agent": "second"}).json()
        assert q["annotators"][0]["annotator"] == "ann" and q["alpha"]["thumbs"]["units"] == 0
        assert client.get("/api/v1/flagged", params={"agent": "second"}).json()[0]["flags"] == "Unsafe ×1"
        assert client.post("/api/v1/annotators/ann/exclude", json={"excluded": True}).json() == {
            "name": "ann", "excluded": True, "reopened": []}
        jsonl = client.get("/api/v1/export", params={"format": "jsonl", "agent": "second"})
        assert jsonl.status_code == 200 and jsonl.headers["content-type"].startswith("application/x-ndjson")
        assert '"annotator_excluded": true' in jsonl.text and "attachment" in jsonl.headers["content-disposition"]
        zipped = client.get("/api/v1/export", params={"format": "verl", "agent": "second"})
        assert zipped.status_code == 200 and zipped.content[:2] == b"PK"
        assert client.get("/api/v1/export", params={"format": "csv"}).status_code == 422
        assert client.get("/api/v1/export", params={"format": "jsonl", "agent": "nobody"}).status_code == 404
    for server in services.servers.values():
        server.close()
    services.servers.clear()


def test_a_thumb_taken_back_is_listed_as_withdrawn_not_live(rated):
    store = rated.store
    rows = store.feedback_rows(store.get_agent("assistant").id)
    target = next(m["id"] for m in rows["messages"] if m["content"] == "good 0")
    store.record_rating(target, "dana", thumb=1, score=4)
    store.withdraw_rating(target, "dana", "thumb")
    table = data_tab.refresh_data(rated, "assistant", "dana", "all", "all", "", None)["table"]
    assert list(table["label"]) == ["👍 (withdrawn) 4/5"]  # the score stands, the thumb was taken back
    store.withdraw_rating(target, "dana", "score")
    table = data_tab.refresh_data(rated, "assistant", "dana", "all", "all", "", None)["table"]
    assert list(table["label"]) == ["👍 (withdrawn) 4/5 (withdrawn)"]


def test_the_wiring_fills_the_refreshed_parts_by_component(rated):
    from gradio.helpers import special_args

    from ui.app import build_ui

    demo = build_ui(rated)
    refreshes = [f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "refresh_data"]
    assert refreshes
    for block_fn in refreshes:
        inputs, *_ = special_args(block_fn.fn, ["assistant", "carol", "all", "all", ""], request=None)
        assert len(inputs) == 6  # gr.Request is still injected through the keyed wrapper
        out = block_fn.fn(*inputs)
        assert [c._id for c in out] == [c._id for c in block_fn.outputs]  # every refreshed part, none else
        assert set(out[block_fn.outputs[0]]["annotator"]) == {"carol"}
