"""A base model whose tokenizer has no chat template (a pretrained-only base, e.g. gemma-3-270m) chats through
every engine: the one prompt encoder (``rlhf.prompting``) templates it as plain ``role: text`` lines everywhere
(the prompt, the shared system-prompt prefix, an engine process's proving step)."""
from __future__ import annotations

import copy

import pytest

from rlhf.prompting import PLAIN_TEMPLATE, encode_prompt, template_ids
from rlhf.serving.llama_cpp.spec import llama_cpp_installed
from rlhf.serving.policy_server import AdapterRef, GenParams, PolicyServer
from tests.conftest import make_tiny_model

LLAMA = pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed (`make setup`)")
SETUPS = [("transformers", "thread"), pytest.param("transformers", "process", marks=pytest.mark.slow),
          pytest.param("llama_cpp", "thread", marks=[LLAMA, pytest.mark.slow]),
          pytest.param("llama_cpp", "process", marks=[LLAMA, pytest.mark.slow])]
HISTORY = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def plain_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None
    return tok


@pytest.fixture(scope="module")
def plain_model_dir(tmp_path_factory, plain_tokenizer):
    target = make_tiny_model(tmp_path_factory.mktemp("no-template"), plain_tokenizer, seed=3)
    assert not (target / "chat_template.jinja").exists()
    return target


def test_the_encoder_templates_a_model_without_a_template_as_plain_lines(plain_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, *HISTORY]
    ids = encode_prompt(plain_tokenizer, messages)
    assert plain_tokenizer.decode(ids) == "system: Be brief.\nuser: Say something.\nassistant: "
    prefix = template_ids(plain_tokenizer, messages[:1], add_generation_prompt=False)
    assert ids[:len(prefix)] == prefix  # the system prompt alone is a prefix the engines can cache
    own = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    assert plain_tokenizer.decode(encode_prompt(plain_tokenizer, messages, template=own)) == \
        "<system>Be brief.<user>Say something."
    assert PLAIN_TEMPLATE.startswith("{% for m in messages %}")


@pytest.mark.parametrize("kind,isolation", SETUPS)
def test_a_base_without_a_chat_template_chats_through_the_engine(plain_model_dir, tmp_path, kind, isolation):
    server = PolicyServer.load(str(plain_model_dir), "cpu", "tiny", max_context_tokens=256, engine=kind,
                               data_dir=str(tmp_path), isolation=isolation)
    try:
        assert server.tokenizer.chat_template is None
        stream = server.stream("Be brief.", HISTORY, AdapterRef(1), GenParams(max_new_tokens=8, temperature=0))
        stream.text()
        assert stream.n_tokens > 0
    finally:
        server.close()
