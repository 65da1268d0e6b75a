"""The one prompt encoder: a chat state -> the token ids a reply continues, fitted to a token budget.

Serving, PPO's rollouts, the reward model and the gate's evaluation all call ``encode_prompt``, so on a long
conversation each of them sees the same prompt (they used to drop turns, cut tokens from the left, or not
truncate at all).

The truncation rule, the only one: keep a leading system message and the newest turn, and drop whole turns,
oldest first, two at a time (so the kept turns still alternate user/assistant), until the templated prompt fits
``max_tokens``. Only when the system message and the newest turn alone are still too long is the templated
prompt cut from the left (the reply must still follow the newest user words).
"""
from __future__ import annotations

from typing import Optional


# The template of a base model that has none: plain ``role: text`` lines, then ``assistant: `` for the reply. Saved
# with a version's tokenizer, so the version's files template a chat exactly as the app did.
PLAIN_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant: {% endif %}")


def chat_template(tokenizer, template: Optional[str] = None) -> str:
    """The template a chat is encoded with: ``template`` (an agent's own), else the tokenizer's, else plain lines."""
    return template or getattr(tokenizer, "chat_template", None) or PLAIN_TEMPLATE


# A short chat every template must render: each message's words must come out, in order.
SAMPLE_CHAT = ({"role": "system", "content": "SYSTEM-WORDS"}, {"role": "user", "content": "USER-WORDS"},
               {"role": "assistant", "content": "ASSISTANT-WORDS"}, {"role": "user", "content": "LAST-WORDS"})


def check_template(template: str) -> str:
    """``template`` (a Jinja chat template) when it renders a chat of system, user, assistant and user messages with
    each message's words in order; ValueError with the reason otherwise. Rendered as transformers renders chat
    templates: in Jinja's immutable sandbox, with ``raise_exception`` and ``add_generation_prompt``."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        text = env.from_string(template).render(messages=list(SAMPLE_CHAT), add_generation_prompt=True,
                                                bos_token="", eos_token="")
    except TemplateError as exc:
        raise ValueError(f"the chat template does not render a chat of system, user, assistant and user "
                         f"messages: {exc}") from None
    at = 0
    for message in SAMPLE_CHAT:
        found = text.find(message["content"], at)
        if found < 0:
            raise ValueError(f"the chat template leaves out (or reorders) the {message['role']} message's words: "
                             "it must render messages[i]['content'] for each message, in order")
        at = found + len(message["content"])
    return template


def template_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                 template: Optional[str] = None) -> list[int]:
    """Ids of ``messages`` templated (``chat_template``), ready for the assistant's reply unless
    ``add_generation_prompt`` is False (a system prompt alone, as a shared prefix)."""
    return list(tokenizer.apply_chat_template(list(messages), chat_template=chat_template(tokenizer, template),
                                              add_generation_prompt=add_generation_prompt, tokenize=True,
                                              return_dict=True)["input_ids"])


def encode_prompt(tokenizer, messages: list[dict], max_tokens: Optional[int] = None,
                  template: Optional[str] = None) -> list[int]:
    """Templated ids of ``messages``, ready for the assistant's reply, fitted to ``max_tokens`` (None = whole);
    ``template``: a chat template of the caller's (an agent's own) in place of the tokenizer's.

    The longest fitting window is found by doubling, then bisection, over the window sizes the rule allows: only
    windows up to about twice the kept one are ever templated, so a history of 10,000 short messages costs what a
    short one does (re-templating after each drop would be quadratic in the history).
    """
    if max_tokens is None:
        return template_ids(tokenizer, messages, template=template)
    system = [m for m in messages[:1] if m["role"] == "system"]
    turns = list(messages[len(system):])
    n = len(turns)
    encoded: dict[int, list[int]] = {}

    def encode(k: int) -> list[int]:  # the newest k turns, templated
        if k not in encoded:
            encoded[k] = template_ids(tokenizer, system + turns[n - k:], template=template)
        return encoded[k]

    if n <= 1:
        return encode(n)[-max_tokens:]
    sizes = [1] + list(range(2 if n % 2 == 0 else 3, n + 1, 2))  # what dropping two at a time leaves, then one

    def fits(i: int) -> bool:
        return len(encode(sizes[i])) <= max_tokens

    if not fits(0):
        return encode(1)[-max_tokens:]
    lo, step = 0, 1  # sizes[lo] fits; find a size that does not (or the end), doubling the step
    while lo + step < len(sizes) and fits(lo + step):
        lo, step = lo + step, step * 2
    hi = min(lo + step, len(sizes))  # sizes[hi] does not fit (or hi is past the end)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return encode(sizes[lo])
