"""The PPO policy as a module (causal LM + LoRA + a value head that only ppo.advantage=gae reads), batched rollouts,
and log-prob forwards.

Layout of a rollout batch: every prompt is left-padded to the same length P, every response is
right-padded to R, so the response always sits in the last R columns. One forward that keeps only the
last R + 1 positions' logits gives the log-prob of every response token and the value of every state
before it, without projecting the prompt positions onto the vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from rlhf.prompting import encode_prompt
from rlhf.training.ppo.core import logprobs_from_logits, other_prompt, relevance


class PolicyWithValue(nn.Module):
    """A causal LM with a LoRA adapter (the policy) and a scalar value head on its last hidden state."""

    def __init__(self, policy: nn.Module, hidden_size: int):
        super().__init__()
        self.policy = policy
        self.value_head = nn.Linear(hidden_size, 1)
        # Zero init: values start at 0 so the first advantages are the (KL-shaped) returns themselves.
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int,
                temperature: float = 1.0, with_values: bool = True):
        """(logits over response tokens (B, R, V) in fp32 / temperature, values (B, R) or None)."""
        # Positions from the mask: left padding must not shift the prompt's positions (as in generate).
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
        out = self.policy(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          logits_to_keep=response_len + 1, output_hidden_states=with_values, use_cache=False)
        # Position t predicts token t + 1: the last R + 1 positions predict the R response tokens.
        logits = out.logits[:, -response_len - 1:-1].float() / temperature
        values = None
        if with_values:
            hidden = out.hidden_states[-1][:, -response_len - 1:-1]
            values = self.value_head(hidden.float()).squeeze(-1)
        return logits, values


def build_policy(base_source: str, ppo_config, device: str, init_adapter: Optional[str] = None, base=None
                 ) -> PolicyWithValue:
    """Base model + trainable LoRA (fresh, or continued from ``init_adapter``) + value head, on ``device``.

    ``ppo_config``: the section with the adapter's ``lora_r``, ``lora_alpha`` (and ``load_in_4bit``): ``ppo``, or
    ``dpo`` for DPO, which trains the same adapter. ``base``: the causal LM already loaded in this process (its
    weights are shared, the adapter goes on them); None loads it from ``base_source``."""
    from peft import LoraConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training

    from rlhf.base_models import load_causal_lm, lora_targets, name_local_base, quantization

    load_in_4bit = getattr(ppo_config, "load_in_4bit", False)
    if base is None:
        base = load_causal_lm(base_source, device, load_in_4bit=load_in_4bit)
    if quantization(load_in_4bit, device) is not None:
        base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    for p in base.parameters():
        p.requires_grad_(False)
    if init_adapter:
        policy = PeftModel.from_pretrained(base, str(init_adapter), is_trainable=True)
        name_local_base(policy, base)  # what this run saves names the local base it trained on
    else:
        # No LoRA dropout: with it, the first update's ratio would not be 1 and the KL estimates noisier.
        lora = LoraConfig(r=ppo_config.lora_r, lora_alpha=ppo_config.lora_alpha, lora_dropout=0.0,
                          target_modules=lora_targets(base), task_type="CAUSAL_LM")
        policy = get_peft_model(base, lora)
    model = PolicyWithValue(policy, base.config.hidden_size).to(device)
    model.eval()  # no dropout anywhere; gradients still flow
    return model


def encode_prompts(tokenizer, prompts: list[list[dict]], max_prompt_tokens: int) -> list[list[int]]:
    """Chat-templated token ids per prompt, fitted to ``max_prompt_tokens`` (``rlhf.prompting.encode_prompt``)."""
    return [encode_prompt(tokenizer, messages, max_prompt_tokens) for messages in prompts]


@dataclass
class Rollout:
    """One batch of sampled replies and everything the update needs about them."""

    input_ids: torch.Tensor  # (B, P + R) prompt (left-padded) + response (right-padded)
    attention_mask: torch.Tensor  # (B, P + R)
    response: torch.Tensor  # (B, R)
    mask: torch.Tensor  # (B, R) float: response tokens up to and including the first EOS
    replies: list[str]
    finished: list[bool]  # ended with EOS (not cut by max_new_tokens)
    logprobs: Optional[torch.Tensor] = None  # (B, R) under the sampling policy, when kept from generate
    values: Optional[torch.Tensor] = None  # (B, R) value of the state before each response token

    @property
    def response_len(self) -> int:
        return self.response.shape[1]

    @property
    def n_tokens(self) -> list[int]:
        return self.mask.sum(1).long().tolist()


def eos_ids(tokenizer, model) -> list[int]:
    """Token ids that end a reply (tokenizer EOS + the model's generation EOS ids)."""
    ids = {tokenizer.eos_token_id}
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        ids.update(value if isinstance(value, (list, tuple)) else [value])
    return sorted(i for i in ids if i is not None)


@torch.no_grad()
def generate(model: PolicyWithValue, tokenizer, prompt_ids: list[list[int]], max_new_tokens: int,
             temperature: float, top_p: float, device: str, greedy: bool = False, keep_stats: bool = False,
             with_values: bool = True) -> Rollout:
    """Sample one reply per prompt in one batched, KV-cached ``generate`` call.

    ``keep_stats`` also keeps each sampled token's log-prob and the value of each state from the logits and
    last hidden states that generation computes anyway, which saves the rollout a full policy forward;
    ``with_values=False`` keeps no hidden states (group baselines need no values).
    """
    enc = tokenizer.pad({"input_ids": prompt_ids}, padding=True, return_tensors="pt", padding_side="left")
    input_ids, attention_mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    stops = eos_ids(tokenizer, model.policy)
    kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, eos_token_id=stops,
                  use_cache=True, repetition_penalty=1.0, top_k=0)
    if greedy:
        kwargs.update(do_sample=False, temperature=None, top_p=None)
    else:
        # Sample from softmax(logits / T) with no top-k and only the configured top-p, so the log-probs we
        # train on are those of the distribution that produced the tokens.
        kwargs.update(do_sample=True, temperature=temperature, top_p=top_p)
    if keep_stats:
        kwargs.update(return_dict_in_generate=True, output_logits=True, output_hidden_states=with_values)
    gen = model.policy.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    out = gen.sequences if keep_stats else gen
    response = out[:, input_ids.shape[1]:]
    if response.shape[1] == 0:  # generate returned nothing new: keep one EOS so shapes stay valid
        response = torch.full((len(prompt_ids), 1), stops[0], dtype=out.dtype, device=out.device)
    is_eos = torch.isin(response, torch.tensor(stops, device=response.device))
    # Keep tokens up to and including the first EOS: stopping is an action too.
    before = (is_eos.long().cumsum(1) - is_eos.long()) == 0
    mask = before.float()
    finished = is_eos.any(1).tolist()
    response = torch.where(before, response, torch.full_like(response, tokenizer.pad_token_id))
    replies = tokenizer.batch_decode([r[m.bool()].tolist() for r, m in zip(response, mask)],
                                     skip_special_tokens=True)
    full_ids = torch.cat([input_ids, response], 1)
    full_mask = torch.cat([attention_mask, mask.long()], 1)
    rollout = Rollout(full_ids, full_mask, response, mask, replies, finished)
    if keep_stats and gen.logits and len(gen.logits) == response.shape[1]:
        # Step t's raw logits (before sampling warpers) and last-layer hidden state, at the last position.
        logits = torch.stack(gen.logits, 1).float() / temperature
        rollout.logprobs = logprobs_from_logits(logits, response)
        if with_values:
            hidden = torch.stack([h[-1][:, -1] for h in gen.hidden_states], 1)
            rollout.values = model.value_head(hidden.float()).squeeze(-1)
    return rollout


def after_prompts(rollout: Rollout, tokenizer, prompt_ids: list[list[int]]) -> Rollout:
    """The same responses after other prompts (one per row, left-padded anew): what the reference model's log-prob
    of each reply would be had another question been asked."""
    dev = rollout.response.device
    enc = tokenizer.pad({"input_ids": prompt_ids}, padding=True, return_tensors="pt", padding_side="left")
    ids = torch.cat([enc["input_ids"].to(dev), rollout.response], 1)
    am = torch.cat([enc["attention_mask"].to(dev), rollout.mask.long()], 1)
    return Rollout(ids, am, rollout.response, rollout.mask, rollout.replies, rollout.finished)


def reply_relevance(model: PolicyWithValue, tokenizer, rollout: Rollout, prompt_ids: list[list[int]],
                    ref_logprobs: torch.Tensor, temperature: float, chunk: int, group_size: int) -> list[float]:
    """Each reply's relevance to its prompt (``core.relevance``): ``ref_logprobs`` are its tokens' reference
    log-probs after its own prompt; one more reference forward reads them after the batch's next prompt."""
    away = after_prompts(rollout, tokenizer, [prompt_ids[j] for j in other_prompt(len(prompt_ids), group_size)])
    away_logprobs, _ = score_tokens(model, away, temperature, chunk, reference=True, with_values=False)
    return relevance(ref_logprobs, away_logprobs, rollout.mask).tolist()


@torch.no_grad()
def score_tokens(model: PolicyWithValue, rollout: Rollout, temperature: float, chunk: int,
                 reference: bool = False, with_values: bool = True):
    """Log-probs (B, R) of the sampled tokens (and values) under the policy, or the reference (adapter off)."""
    logps, values = [], []
    for i in range(0, rollout.input_ids.shape[0], chunk):
        ids = rollout.input_ids[i:i + chunk]
        am = rollout.attention_mask[i:i + chunk]
        if reference:
            with model.policy.disable_adapter():
                logits, v = model(ids, am, rollout.response_len, temperature, with_values=False)
        else:
            logits, v = model(ids, am, rollout.response_len, temperature, with_values=with_values)
        logps.append(logprobs_from_logits(logits, rollout.response[i:i + chunk]))
        if v is not None:
            values.append(v)
    return torch.cat(logps), (torch.cat(values) if values else None)
