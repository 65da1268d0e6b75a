"""One prompt encoder: serving, PPO's rollouts, the reward model and the gate's evaluation fit a long conversation
to the same prompt ids (they used to drop turns, cut tokens from the left, and not truncate)."""
from __future__ import annotations

from rlhf.prompting import encode_prompt, template_ids

BUDGET = 96


def long_conversation(turns: int = 40) -> list[dict]:
    words = ["alpha", "beta", "gamma", "delta", "why?", "ok"]
    history = [{"role": "user" if i % 2 == 0 else "assistant",
                "content": " ".join(words[(i + j) % len(words)] for j in range(5 + i % 7))} for i in range(turns - 1)]
    return [{"role": "system", "content": "Be brief."}] + history + [{"role": "user", "content": "And now?"}]


def test_the_rule_keeps_the_system_message_and_the_newest_turn_and_drops_whole_old_turns(tokenizer):
    messages = long_conversation()
    ids = encode_prompt(tokenizer, messages, BUDGET)
    assert len(ids) <= BUDGET < len(template_ids(tokenizer, messages))
    assert any(template_ids(tokenizer, messages[:1] + messages[-k:]) == ids for k in range(1, len(messages))), \
        "the prompt is not the system message + a whole number of the newest turns"
    assert tokenizer.decode(ids).count("Be brief.") == 1 and "And now?" in tokenizer.decode(ids)
    assert encode_prompt(tokenizer, messages) == template_ids(tokenizer, messages)  # no budget: the whole state


def test_serving_ppo_reward_model_and_gate_see_the_same_prompt(tokenizer, tiny_server):
    from rlhf.retrain.evaluation import generate_replies
    from rlhf.training.ppo.rollout import encode_prompts
    from rlhf.training.tokens import encode_with_reply

    budget = tiny_server.max_context_tokens
    messages = long_conversation(200)
    assert len(template_ids(tokenizer, messages)) > budget
    # Serving: the chat server's prompt for this state
    served = tiny_server.build_prompt(messages[0]["content"], messages[1:])
    # PPO's rollouts
    (rollout,) = encode_prompts(tokenizer, [messages], budget)
    # The reward model: the ids before the reply
    ids, n_reply = encode_with_reply(tokenizer, messages, "A short reply.", max_length=budget + 64,
                                     max_prompt_tokens=budget)
    scored = ids[:len(ids) - n_reply]
    # The gate's evaluation: the prompt ids its replies continue
    (evaluated,) = generate_replies(tiny_server.model, tokenizer, [messages], [None], 1, 0.0, 0,
                                    max_prompt_tokens=budget)
    assert served == rollout == scored == evaluated.prompt_ids[0]
