"""How a (prompt, reply) pair becomes token ids for scoring: the one encoding every reward model reads."""
from __future__ import annotations

from typing import Optional

from rlhf.prompting import encode_prompt


def encode_with_reply(tokenizer, prompt: list[dict], reply: str, max_length: int,
                      max_prompt_tokens: Optional[int] = None) -> tuple[list[int], int]:
    """Ids of the prompt (``rlhf.prompting.encode_prompt``) + the reply, at most ``max_length``, and how many are
    reply.

    The prompt gets the room the reply leaves, at most ``max_prompt_tokens`` (PPO's and the gate's prompt budget,
    so the reward model reads the prompt the policy answered), and is fitted by the one truncation rule (whole
    oldest turns dropped). Only a reply that alone fills ``max_length`` is cut, from its start, so a sequence
    always ends at the reply's last token. That token is exactly what a policy generated, with no closing
    end-of-turn token, which would read as padding (pad == eos for SmolLM2) and move a last-token score off it.
    """
    reply_ids = list(tokenizer(reply, add_special_tokens=False)["input_ids"])
    budget = max(1, max_length - len(reply_ids))
    if max_prompt_tokens is not None:
        budget = min(budget, max_prompt_tokens)
    ids = (encode_prompt(tokenizer, prompt, budget) + reply_ids)[-max_length:]
    return ids, min(len(reply_ids), len(ids))


def encode(tokenizer, prompt: list[dict], reply: str, max_length: int,
           max_prompt_tokens: Optional[int] = None) -> list[int]:
    """Token ids of the fitted prompt + the reply, ending at the reply's last token (``encode_with_reply``)."""
    return encode_with_reply(tokenizer, prompt, reply, max_length, max_prompt_tokens)[0]
