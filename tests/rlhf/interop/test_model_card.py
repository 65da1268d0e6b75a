"""A published version is a Hugging Face model: hub-named base, a real model card, plain PEFT loads it, the
app still loads it offline, it downloads as a zip and pushes to a Hub (a local one here, over real HTTP)."""
from __future__ import annotations

import base64
import dataclasses
import json
import shutil
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cli import main
from rlhf.config import load_config
from rlhf.interop.hub import HubError, export_version, push_policy, zip_version
from rlhf.retrain.publish import publish_version
from storage import Store
from tests.conftest import make_adapter

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
METRICS = {"reward_model/cv_accuracy": 0.8, "reward_model/cv_low": 0.7, "reward_model/cv_high": 0.9,
           "gate/verdict": "promote", "gate/win_rate": 0.75, "gate/low": 0.62, "gate/high": 0.88,
           "gate/judged": True, "gate/evidence": "judge", "eval/win_rate": 0.84,
           "gate/reason": "the lower bound is above 0.5", "eval/kl": 3.25, "feedback_used": 4}


@pytest.fixture
def shipped(tmp_path, tiny_model_dir):
    """A data dir whose default agent runs on the shipped model name: its converted copy (a tiny model here)
    lies under data/models/ as the app writes it. One version trained on votes by two annotators (a third one
    excluded), promoted, and rated in the arena against the base."""
    config = load_config(env={}, overrides=[f"data_dir={tmp_path / 'data'}", "base_model=smollm2-135m-instruct",
                                            "device=cpu"])
    local_base = config.data_path / "models" / "smollm2-135m-instruct"
    shutil.copytree(tiny_model_dir, local_base)
    store = Store(config.db_path)
    agent = store.ensure_default_agent("smollm2-135m-instruct")
    v0 = store.active_policy(agent.id)
    replies = []
    for i, annotator in enumerate(["ann", "bob", "ann", "eve"]):
        conv = store.create_conversation(agent.id, messages=[{"role": "user", "content": f"question {i}"}])
        a = store.record_reply(store.leaf(conv.id).id, f"good {i}", v0.id)
        b = store.record_reply(a.parent_id, f"bad {i}", v0.id)
        store.record_comparison(a.id, b.id, "a", annotator)
        store.record_rating(a.id, annotator, thumb=1)
        replies.append(a)
    store.set_annotator_excluded("eve", True)
    snapshot = store.feedback_watermark(agent.id)
    adapter = make_adapter(local_base, tmp_path / "trained", seed=5)
    v1 = publish_version(store, config, agent.name, adapter, parent_id=v0.id, promote=True, job_id=None,
                         data_snapshot=snapshot, run_config=config.to_dict(), metrics=METRICS)
    for i in range(3):  # arena: v1 beats the base twice, one tie
        conv = store.create_conversation(agent.id, messages=[{"role": "user", "content": f"arena {i}"}])
        new = store.record_reply(store.leaf(conv.id).id, f"new {i}", v1.id)
        old = store.record_reply(new.parent_id, f"old {i}", v0.id)
        store.record_comparison(new.id, old.id, "tie" if i == 2 else "a", "ann")
    yield {"config": config, "store": store, "v0": v0, "v1": store.get_policy(v1.id), "local_base": local_base}
    store.close()


def test_a_published_adapter_names_its_base_by_hub_id_and_the_app_keeps_the_local_path(shipped):
    version_dir = Path(shipped["v1"].adapter_path)
    adapter_cfg = json.loads((version_dir / "adapter_config.json").read_text())
    assert adapter_cfg["base_model_name_or_path"] == HUB_ID
    meta = json.loads((version_dir / "version.json").read_text())
    assert meta["base_model"] == HUB_ID and meta["base_model_on_hub"] is True
    assert meta["base_model_path"] == "models/smollm2-135m-instruct"  # relative: the data dir can move


def test_the_card_is_a_real_model_card(shipped):
    from huggingface_hub import ModelCard

    card = ModelCard((Path(shipped["v1"].adapter_path) / "README.md").read_text())
    assert card.data.base_model == HUB_ID and card.data.library_name == "peft" and card.data.license == "apache-2.0"
    assert f"base_model:adapter:{HUB_ID}" in card.data.tags and card.data.pipeline_tag == "text-generation"
    text = card.text
    assert "More Information Needed" not in text
    assert "**3 votes**" in text and "3 ratings" in text and "**2 annotators**" in text  # eve is excluded
    assert "80% (95% interval 70%–90%)" in text  # reward-model accuracy with its interval
    assert "**promote**" in text and "0.75 (95% interval 0.62–0.88)" in text  # the judge's, not the reward model's
    assert "on 84% of the held-out prompts" in text
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in text and "(Q4_1), dequantised" in text  # the weights it trained on
    assert "then PPO on the reward model" in text and "ppo" in card.data.tags  # the run config's retrain.method
    assert "3.25 nats per reply" in text
    assert shipped["v1"].created[:10] in text and "| License | apache-2.0" in text
    assert f'AutoModelForCausalLM.from_pretrained("{HUB_ID}")' in text and "PeftModel.from_pretrained(base" in text
    assert "not rated yet (no arena votes)" in text  # written at publish time
    assert "then PPO on the reward model)" in text and "ppo" in card.data.tags  # the version's own retrain.method


def test_the_card_names_the_method_from_the_versions_config(shipped):
    from rlhf.retrain.model_card import card_facts, render_card

    store, v1 = shipped["store"], shipped["v1"]
    facts = card_facts(store, v1)
    assert facts.method == "ppo"
    text = render_card(dataclasses.replace(facts, method="rpo"))
    assert "then DPO with the chosen replies' likelihood (RPO))" in text and "- rpo" in text and "- ppo" not in text


def test_an_exported_card_reads_the_arena_rating_now(shipped, tmp_path):
    from huggingface_hub import ModelCard

    folder = export_version(shipped["store"], shipped["v1"].id, tmp_path / "export", repo_id="team/assistant-rlhf")
    text = ModelCard.load(folder / "README.md").text
    assert "(Bradley–Terry on the Elo scale, 95% interval " in text and ", 3 votes)" in text
    assert 'PeftModel.from_pretrained(base, "team/assistant-rlhf")' in text


def test_plain_peft_loads_the_published_adapter_on_the_local_base(shipped, monkeypatch):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    base = AutoModelForCausalLM.from_pretrained(shipped["local_base"])
    with torch.no_grad():
        before = base(ids).logits
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(shipped["local_base"]),
                                      shipped["v1"].adapter_path)
    with torch.no_grad():
        after = model(ids).logits
    assert not torch.allclose(before, after)  # the adapter is loaded and active


def test_the_app_still_serves_and_trains_on_from_the_local_base(shipped):
    """Serving and PPO never load a base from the adapter's config; a continued run names the local base."""
    from rlhf.base_models import resolve_model
    from rlhf.serving.policy_server import AdapterRef, GenParams, PolicyServer
    from rlhf.training.ppo.rollout import build_policy

    config, v1 = shipped["config"], shipped["v1"]
    source = resolve_model(config.base_model, config.data_path, allow_hub=False)
    assert source == str(shipped["local_base"])
    server = PolicyServer.load(source, "cpu", config.base_model, max_context_tokens=256)
    try:
        reply = server.generate("", [{"role": "user", "content": "hi"}], AdapterRef(v1.id, v1.adapter_path),
                                GenParams(max_new_tokens=4, temperature=0.0))
        assert isinstance(reply, str)
    finally:
        server.close()
    model = build_policy(source, config.ppo, "cpu", init_adapter=v1.adapter_path)
    out = Path(config.data_path) / "runs" / "continued"
    model.policy.save_pretrained(out)
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == source


def test_a_version_downloads_as_a_zip_of_a_hub_ready_folder(shipped, tmp_path):
    store = shipped["store"]
    path = zip_version(store, shipped["v1"].id, tmp_path / "dl")
    assert path.name == "assistant-v1.zip"
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        assert {"README.md", "adapter_config.json", "adapter_model.safetensors", "adapter_model.gguf",
                "tokenizer.json", "tokenizer_config.json"} <= names and "version.json" not in names
        assert json.loads(z.read("adapter_config.json"))["base_model_name_or_path"] == HUB_ID
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == ["assistant-v1.zip"]
    with pytest.raises(HubError, match="base model itself"):
        zip_version(store, shipped["v0"].id, tmp_path / "dl2")


class FakeHub:
    """The few Hub endpoints ``create_repo`` and ``create_commit`` call, on loopback; the commit's files are kept.
    Like the Hub it refuses a README whose metadata does not parse."""

    def __init__(self, public_repos=()):
        hub = self
        self.requests, self.files = [], {}
        self.repos = {name: False for name in public_repos}  # repo -> private

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status, answer):
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # model_info: what the Hub says about an existing repo
                hub.requests.append((self.path, self.headers.get("Authorization")))
                repo = self.path.split("?")[0].removeprefix("/api/models/")
                status, answer = (200, {"id": repo, "private": hub.repos[repo], "sha": "1" * 40}) \
                    if repo in hub.repos else (404, {"error": "Repository not found"})
                self.reply(status, answer)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hub.requests.append((self.path, self.headers.get("Authorization")))
                status, answer = hub.answer(self.path.split("?")[0], body)
                self.reply(status, answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str, body: bytes) -> tuple[int, dict]:
        from huggingface_hub import ModelCard

        if path == "/api/repos/create":
            req = json.loads(body)
            private = bool(req.get("private")) or req.get("visibility") == "private"
            self.repos.setdefault(f"{req['organization']}/{req['name']}", private)
            return 200, {"url": f"{self.url}/{req['organization']}/{req['name']}"}
        if path == "/api/validate-yaml":
            try:
                ModelCard(json.loads(body)["content"])
            except Exception as exc:  # what the Hub answers for bad metadata
                return 400, {"errors": [{"message": str(exc)}]}
            return 200, {"warnings": []}
        if path.endswith("/preupload/main"):
            files = json.loads(body)["files"]
            return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                   for f in files]}
        if path.endswith("/commit/main"):
            for line in body.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    self.files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
            repo = path.split("/api/models/", 1)[1].rsplit("/commit/", 1)[0]
            return 200, {"commitUrl": f"{self.url}/{repo}/commit/{'1' * 40}", "commitOid": "1" * 40}
        return 404, {"error": f"not a Hub endpoint here: {path}"}

    def close(self):
        self.server.shutdown()


def test_push_policy_commits_the_version_to_the_hub(shipped, tmp_path, monkeypatch, capsys):
    hub = FakeHub()
    config, v1 = shipped["config"], shipped["v1"]
    try:
        monkeypatch.setenv("HF_TOKEN", "hf_secret_test")
        argv = ["push-policy", str(v1.id), "--repo", "team/assistant-rlhf", "--set", f"data_dir={config.data_dir}",
                "--set", f"server.hf_endpoint={hub.url}", "--set", "base_model=smollm2-135m-instruct"]
        assert main(argv) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    finally:
        hub.close()
    assert out["repo"] == "team/assistant-rlhf" and out["commit"] == "1" * 40
    assert {"README.md", "adapter_config.json", "adapter_model.safetensors", "adapter_model.gguf", "tokenizer.json",
            "tokenizer_config.json"} <= set(hub.files) and "version.json" not in hub.files
    assert hub.files["adapter_model.safetensors"] == \
        (Path(v1.adapter_path) / "adapter_model.safetensors").read_bytes()
    assert json.loads(hub.files["adapter_config.json"])["base_model_name_or_path"] == HUB_ID
    assert 'PeftModel.from_pretrained(base, "team/assistant-rlhf")' in hub.files["README.md"].decode()
    paths = [p for p, _ in hub.requests]
    assert hub.repos == {"team/assistant-rlhf": True}  # created private
    assert "/api/validate-yaml" in paths  # the Hub checks the card's metadata before the upload
    assert paths[0] == "/api/repos/create" and paths[-1].startswith("/api/models/team/assistant-rlhf/commit/")
    assert {auth for _, auth in hub.requests} == {"Bearer hf_secret_test"}


def test_push_policy_refuses_an_existing_public_repo_unless_public(shipped, monkeypatch, capsys):
    """Issue #33: create_repo(private=True, exist_ok=True) keeps an existing repo as it is: a public one would have
    received the version. Now the push stops first, unless --public says so."""
    hub = FakeHub(public_repos=["team/open"])
    config, v1 = shipped["config"], shipped["v1"]
    monkeypatch.setenv("HF_TOKEN", "hf_secret_test")
    argv = ["push-policy", str(v1.id), "--repo", "team/open", "--set", f"data_dir={config.data_dir}",
            "--set", f"server.hf_endpoint={hub.url}", "--set", "base_model=smollm2-135m-instruct"]
    try:
        assert main(argv) == 1
        assert "is public" in capsys.readouterr().err and hub.files == {}  # nothing was pushed
        assert main(argv + ["--public"]) == 0 and "README.md" in hub.files
    finally:
        hub.close()


def test_the_card_names_no_system_prompt_unless_asked(shipped, tmp_path):
    store, v1 = shipped["store"], shipped["v1"]
    secret = "You are Acme's support bot. Internal escalation code: 7731."
    store.update_agent("assistant", system_prompt=secret)
    text = (export_version(store, v1.id, tmp_path / "plain") / "README.md").read_text()
    assert secret not in text and "7731" not in text and "not published with this card" in text
    assert '"content": "YOUR SYSTEM PROMPT"' in text
    asked = (export_version(store, v1.id, tmp_path / "asked", with_system_prompt=True) / "README.md").read_text()
    assert json.dumps(secret) in asked


def test_push_policy_without_a_token_says_what_to_set(shipped, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("RLHF_SERVER_HF_TOKEN", raising=False)
    assert main(["push-policy", str(shipped["v1"].id), "--repo", "team/x",
                 "--set", f"data_dir={shipped['config'].data_dir}"]) == 2
    assert "HF_TOKEN" in capsys.readouterr().err
    with pytest.raises(HubError, match="HF_TOKEN"):
        push_policy(shipped["store"], shipped["config"], shipped["v1"].id, "team/x")


def test_an_old_version_exports_with_a_hub_named_base_too(shipped, tmp_path):
    """A version published before this release names the converted copy's local path: the export fixes it."""
    v1 = shipped["v1"]
    cfg_path = Path(v1.adapter_path) / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = str(shipped["local_base"])
    cfg_path.write_text(json.dumps(cfg))
    (Path(v1.adapter_path) / "version.json").write_text(json.dumps({"agent": "assistant"}))
    folder = export_version(shipped["store"], v1.id, tmp_path / "export")
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == HUB_ID
    assert f"base_model: {HUB_ID}" in (folder / "README.md").read_text()


def test_a_downloaded_version_imports_back_as_a_version(shipped, tmp_path):
    """The round trip: export (hub-named base) → import-policy → a new version on the local base, hub-named again."""
    from rlhf.interop.import_policy import import_policy

    folder = export_version(shipped["store"], shipped["v1"].id, tmp_path / "export")
    result = import_policy(shipped["store"], shipped["config"], folder, "assistant")
    version_dir = Path(result.policy.adapter_path)
    assert json.loads((version_dir / "adapter_config.json").read_text())["base_model_name_or_path"] == HUB_ID
    assert "Imported from `export`" in (version_dir / "README.md").read_text()


def test_a_downloaded_version_loads_with_its_own_tokenizer_and_chat_template(shipped, tmp_path, monkeypatch):
    """The zip travels whole: AutoTokenizer and PeftModel load the unzipped folder, and llama.cpp's GGUF LoRA is
    in it (converted for the same base)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = zip_version(shipped["store"], shipped["v1"].id, tmp_path / "dl")
    folder = tmp_path / "unzipped"
    with zipfile.ZipFile(path) as z:
        z.extractall(folder)
    base_tok = AutoTokenizer.from_pretrained(shipped["local_base"])
    tok = AutoTokenizer.from_pretrained(folder)
    chat = [{"role": "user", "content": "Hello!"}]
    assert tok.chat_template == base_tok.chat_template
    assert tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == \
        base_tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(shipped["local_base"]), str(folder))
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([tok.encode("Hello!")])).logits).all()
    import gguf

    lora = gguf.GGUFReader(str(folder / "adapter_model.gguf"))
    assert lora.fields["adapter.type"].contents() == "lora" and any(t.name.endswith("lora_a") for t in lora.tensors)


def test_a_base_without_a_template_travels_with_the_plain_template_the_app_used(shipped, tmp_path):
    from transformers import AutoTokenizer

    from rlhf.prompting import PLAIN_TEMPLATE, encode_prompt
    from rlhf.retrain.bundle import add_tokenizer

    base = tmp_path / "plain-base"
    shutil.copytree(shipped["local_base"], base)
    (base / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((base / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert not AutoTokenizer.from_pretrained(base).chat_template
    out = tmp_path / "version"
    out.mkdir()
    add_tokenizer(out, str(base))
    tok = AutoTokenizer.from_pretrained(out)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tok.chat_template == PLAIN_TEMPLATE
    assert tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"] \
        == encode_prompt(AutoTokenizer.from_pretrained(base), chat)


def test_the_card_states_the_method_and_no_placeholder_interval(shipped, tmp_path):
    from rlhf.retrain.model_card import card_facts, render_card

    store, config = shipped["store"], shipped["config"]
    agent = store.get_agent(shipped["v1"].agent_id)
    run = config.to_dict()
    run["retrain"]["method"] = "dpo"
    unjudged = {**METRICS, "gate/verdict": "inconclusive", "gate/win_rate": 0.5, "gate/low": 0.0, "gate/high": 1.0,
                "gate/judged": False, "gate/evidence": "none", "gate/reason": "no held-out judge"}
    adapter = make_adapter(shipped["local_base"], tmp_path / "dpo", seed=6)
    v2 = publish_version(store, config, agent.name, adapter, parent_id=shipped["v1"].id, promote=False,
                         job_id=None, data_snapshot=store.feedback_watermark(agent.id), run_config=run,
                         metrics=unjudged)
    text = render_card(card_facts(store, v2))
    assert "then DPO on the preference pairs" in text and "PPO" not in text
    assert "0.00–1.00" not in text and "without a held-out judge (no interval measured)" in text


def test_the_card_says_when_the_voice_watch_stopped_training(shipped, tmp_path):
    from rlhf.retrain.model_card import card_facts, render_card

    store, config = shipped["store"], shipped["config"]
    agent = store.get_agent(shipped["v1"].agent_id)
    stopped = {**METRICS, "voice_watch/step": 9, "voice_watch/kept": 7, "voice_watch/of": 16,
               "voice_watch/reason": "repeated 3-grams up 0.017 (ppo.stop_repetition_rise=0.015)"}
    v2 = publish_version(store, config, agent.name, make_adapter(shipped["local_base"], tmp_path / "v2", seed=7),
                         parent_id=shipped["v1"].id, promote=False, job_id=None,
                         data_snapshot=store.feedback_watermark(agent.id), run_config=config.to_dict(),
                         metrics=stopped)
    text = render_card(card_facts(store, v2))
    assert "Training stopped at step 9 of 16" in text and "kept the weights after step 7 (the voice watch)" in text
    assert "Training stopped" not in render_card(card_facts(store, shipped["v1"]))


def test_the_card_says_when_the_voice_check_went_back_to_earlier_weights(shipped, tmp_path):
    from rlhf.retrain.model_card import card_facts, render_card

    store, config = shipped["store"], shipped["config"]
    agent = store.get_agent(shipped["v1"].agent_id)
    reason = "repeated 3-grams 0.019 -> 0.096 (gate.max_repetition_ratio=2.0, gate.max_repetition_rise=0.02)"
    cards = []
    # went back to step 12; found no earlier weights that kept the voice; kept step 12's, whose sampled replies passed
    # and (ppo.voice_check_blends) kept half the final weights' change, passing in every view or in one
    cases = ((12, "every view", None), (16, "none", None), (12, "sampled replies", None), (16, "every view", 0.5),
             (16, "sampled replies", 0.75))
    for i, (kept, passes, blend) in enumerate(cases):
        checked = {**METRICS, "voice_watch/step": 16, "voice_watch/kept": kept, "voice_watch/of": 16,
                   "voice_watch/reason": reason, "voice_watch/by": "check", "voice_watch/passes": passes,
                   **({"voice_watch/blend": blend} if blend is not None else {})}
        version = publish_version(store, config, agent.name,
                                  make_adapter(shipped["local_base"], tmp_path / f"v{i}", seed=8 + i),
                                  parent_id=shipped["v1"].id, promote=False, job_id=None,
                                  data_snapshot=store.feedback_watermark(agent.id), run_config=config.to_dict(),
                                  metrics=checked)
        cards.append(render_card(card_facts(store, version)))
    assert "After step 16 of 16" in cards[0] and "kept the weights after step 12 (the voice check)" in cards[0]
    assert "found none" in cards[1] and "kept the weights" not in cards[1]
    assert "No earlier weights passed" not in cards[0] + cards[1] + cards[3]
    assert "kept the weights after step 12" in cards[2] and "these weights' sampled replies did" in cards[2]
    assert "it kept 50% of the change its training made" in cards[3] and "found none" not in cards[3]
    assert "it kept 75% of the change" in cards[4] and "these weights' sampled replies did" in cards[4]
    assert all("Training stopped" not in card for card in cards)
