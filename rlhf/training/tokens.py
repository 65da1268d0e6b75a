"""How a (prompt, reply) pair becomes token ids for scoring: the one encoding every reward model reads."""
from __future__ import annotations


def _prompt_ids(tokenizer, prompt: list[dict]) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"])
    text = "".join(f"{m['role']}: {m['content']}\n" for m in prompt) + "assistant: "  # a base model: plain lines
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_with_reply(tokenizer, prompt: list[dict], reply: str, max_length: int) -> tuple[list[int], int]:
    """Ids of the templated prompt + the reply, cut from the left to ``max_length``, and how many are reply.

    The reply's tokens are exactly what a policy generates after the prompt, with no closing end-of-turn token,
    which would read as padding (pad == eos for SmolLM2) and move a last-token score off the reply.
    """
    reply_ids = list(tokenizer(reply, add_special_tokens=False)["input_ids"])
    ids = (_prompt_ids(tokenizer, prompt) + reply_ids)[-max_length:]
    return ids, min(len(reply_ids), len(ids))


def encode(tokenizer, prompt: list[dict], reply: str, max_length: int) -> list[int]:
    """Token ids of the templated prompt + the reply, ending at the reply's last token, cut from the left."""
    return encode_with_reply(tokenizer, prompt, reply, max_length)[0]
