"""The training sections: ``reward`` (the reward model), ``ppo`` and ``dpo`` (the two ways the policy learns;
``retrain.method`` picks one) and ``eval`` (how a candidate is compared with the active version before the gate)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rlhf.config.fields import Checked, ConfigError, default_of, groups, one_of, opt
from rlhf.registry import REWARD_KINDS

GAE_ONLY = ("gamma", "lam", "vf_coef", "clip_range_value")  # ppo keys that only the value-head path reads


@dataclass
class RewardConfig(Checked):
    mode: str = opt("auto", "auto | pairwise | pointwise: how the reward model is trained.")
    method: str = opt("auto", "auto | head | lora: linear head on frozen features, or LoRA fine-tuning (auto: the "
                      "head until lora_min_pairs).")
    lora_min_pairs: int = opt(2000, "With method=auto, LoRA fine-tuning from this many pairs on.")
    head_c: float = opt(0.05, "Inverse L2 strength of the linear head (smaller = stronger regularisation).")
    ensemble: int = opt(8, "Bootstrap members of the linear head (their spread is the model's uncertainty).")
    cv_folds: int = opt(5, "Folds of the cross-validated accuracy (grouped by conversation).")
    cv_permutations: int = opt(200, "Label-shuffled refits behind the cross-validated accuracy's interval (its null: "
                               "on coin-flip votes the interval holds 0.5); 0 = a Wilson interval, which treats "
                               "the folds as independent and is too narrow.")
    min_pairs: int = opt(16, "Feedback a pairwise reward model needs when mode=auto: preference pairs, or votes "
                         "(ties included) and ratings with min_decided_pairs decided pairs among them; the vote "
                         "queue picks by uncertainty from this many pairs on.")
    min_decided_pairs: int = opt(8, "Fewest decided preference pairs (a winner, or differently rated regenerations) "
                                 "a pairwise reward model trains on, when ties and ratings make up min_pairs.")
    min_pointwise: int = opt(8, "Rated replies needed for pointwise training.")
    epochs: float = opt(2.0, "LoRA method: training epochs over the reward data.")
    learning_rate: float = opt(2e-4, "LoRA method: learning rate.")
    batch_size: int = opt(8, "LoRA method: batch size.")
    max_length: int = opt(512, "Longest prompt+reply in tokens; longer rows are truncated from the left.")
    lora_r: int = opt(16, "LoRA rank of the reward model adapter.")
    lora_alpha: int = opt(32, "LoRA alpha of the reward model adapter.")
    lora_layers: int = opt(8, "LoRA only in the top N transformer layers (0 = all); fewer train faster.")
    eval_fraction: float = opt(0.2, "LoRA method: share of conversations held out for evaluation.")
    seed: int = opt(0, "Seed for the split and training.")
    load_in_4bit: bool = opt(False, "Load the reward backbone in 4-bit (CUDA only).")
    margin_per_score: float = opt(0.25, "Pair margin added per point of score difference.")
    rated_vs_unrated: bool = opt(False, "Also pair a thumbs-up reply with an unrated sibling.")
    exclude_annotators: list = opt([], "Annotator names whose feedback is left out of training.")
    whole_sentences: bool = opt(True, "Read a reply cut at a token limit up to its last whole sentence (PPO's reward, "
                                "the gate's judge): people vote on whole replies, and a cut one reads as worse, which "
                                "taught PPO to stop early (#40).")

    def check(self) -> None:
        """Raise ConfigError naming the key when a value cannot train (called at load and before a run)."""
        one_of("reward.mode", self.mode, ("auto", "pairwise", "pointwise"))
        one_of("reward.method", self.method, ("auto", *REWARD_KINDS))
        if min(self.min_pairs, self.min_decided_pairs, self.min_pointwise, self.ensemble, self.batch_size,
               self.lora_r) < 1:
            raise ConfigError("reward.min_pairs, reward.min_decided_pairs, reward.min_pointwise, reward.ensemble, "
                              "reward.batch_size and "
                              "reward.lora_r must be >= 1")
        if self.cv_permutations < 0 or self.cv_permutations == 1 or self.cv_permutations > 10_000:
            raise ConfigError(f"reward.cv_permutations must be 0 or in 2..10000, got {self.cv_permutations}")
        if self.cv_folds < 2 or self.max_length < 8 or self.epochs <= 0 or self.head_c <= 0:
            raise ConfigError("reward.cv_folds must be >= 2, reward.max_length >= 8, reward.epochs and "
                              "reward.head_c > 0")
        if not 0 <= self.eval_fraction < 1:
            raise ConfigError(f"reward.eval_fraction must be in [0, 1), got {self.eval_fraction}")


@dataclass
class PPOConfig(Checked):
    """PPO settings; each key names its concern (``group``), which the config table (docs/configuration.md) shows."""
    batch_size: int = opt(4, "Prompts per rollout (per process under accelerate launch).", "rollout")
    group_size: int = opt(4, "Replies sampled per prompt (ppo.advantage=group needs at least 2).", "rollout")
    max_new_tokens: int = opt(48, "Reply length during rollouts.", "rollout")
    max_prompt_tokens: int = opt(384, "Longest rollout prompt in tokens; the oldest turns are cut first.", "rollout")
    temperature: float = opt(1.0, "Sampling temperature during rollouts.", "rollout")
    top_p: float = opt(1.0, "Nucleus mass during rollouts.", "rollout")
    adversarial_ratio: float = opt(0.5, "Share of rollout prompts drawn from low-rated contexts.", "rollout")
    prompt_file: str = opt("", "Extra prompts (JSONL/TXT); empty = the starter set in assets/.", "rollout")
    steps: int = opt(16, "PPO iterations (rollout + update); 16 learned more than 8 once the reward model read "
                     "whole sentences (bench.loop_table, #40).", "optimisation")
    mini_batch_size: int = opt(4, "Rollouts per gradient step.", "optimisation")
    ppo_epochs: int = opt(1, "Passes over each rollout batch (a second pass spent KL and the replies' variety for "
                          "little preference on 64 votes: bench loop, #35).", "optimisation")
    advantage: str = opt("group", "group | gae: a reply's return minus the mean of the other replies to its prompt "
                         "(RLOO, no value head), or GAE on a value head (Schulman et al. 2016).", "optimisation")
    learning_rate: float = opt(1e-3, "Policy LoRA (+ value head with ppo.advantage=gae) learning rate.",
                               "optimisation")
    gamma: float = opt(1.0, "GAE discount (ppo.advantage=gae only).", "optimisation")
    lam: float = opt(0.95, "GAE lambda (ppo.advantage=gae only).", "optimisation")
    clip_range: float = opt(0.2, "Policy ratio clip.", "optimisation")
    clip_range_value: float = opt(0.2, "Value clip (ppo.advantage=gae only).", "optimisation")
    vf_coef: float = opt(0.5, "Value loss weight (ppo.advantage=gae only).", "optimisation")
    ent_coef: float = opt(0.0, "Entropy bonus weight.", "optimisation")
    max_grad_norm: float = opt(1.0, "Gradient clipping norm.", "optimisation")
    kl_init: float = opt(0.05, "Initial KL penalty coefficient.", "KL")
    kl_target: float = opt(6.0, "Target KL (nats per reply) for the adaptive coefficient; 0 = fixed.", "KL")
    kl_horizon: int = opt(10000, "Horizon of the adaptive KL controller.", "KL")
    kl_limit: float = opt(20.0, "Hard KL limit per reply; a minibatch above it is skipped.", "KL")
    approx_kl_stop: float = opt(0.5, "Stop the update epochs early when approx KL exceeds this.", "KL")
    stop_repetition_rise: float = opt(0.0, "Voice watch: stop the run, keeping the last weights whose rollouts "
                                      "kept the voice, once the rollouts' repeated 3-grams (mean over "
                                      "ppo.stop_window steps) rise this much above the first step's (0 = off; "
                                      "0.015 kept concrete's voice at 16 votes but also stopped a run that kept "
                                      "it: rlhf.training.ppo.voice_watch, BENCHMARKS.md).", "guards")
    stop_distinct_drop: float = opt(0.0, "Voice watch: the same stop when the rollouts' distinct-2 falls this much "
                                    "below the first step's (0 = off: over 4 prompts a step it dips 0.05-0.07 in "
                                    "runs that keep their voice).", "guards")
    stop_window: int = opt(2, "Voice watch: steps averaged before comparing with the first step.", "guards")
    voice_check_tokens: int = opt(64, "Voice check at the end of a run (0 = off): sample replies this many tokens "
                                  "long to the eval prompts from the starting and the final weights; when the final "
                                  "ones trip the gate's distinct-2, repetition or length check, keep the latest "
                                  "checkpoint (ppo.save_every) whose replies pass instead "
                                  "(rlhf.training.ppo.voice_watch). 64 "
                                  "kept the voice on every cell of #40's table that had lost it (BENCHMARKS.md).",
                                  "guards")
    voice_check_gate: bool = opt(True, "The voice check also reads the replies the gate's guard reads (one a "
                                 "prompt at eval.reply_temperature, eval.max_new_tokens long), beside its sampled "
                                 "ones, and keeps only weights that pass in both: a retrain driven through the app "
                                 "passed the sampled check and was refused by the guard for its greedy replies' "
                                 "repeated 3-grams (BENCHMARKS.md).", "guards")
    voice_check_blends: int = opt(0, "Voice check: besides the checkpoints, try the final weights' change from the "
                                  "start scaled to (N-1)/N, ..., 1/N of itself (0 = off), in the order "
                                  "ppo.voice_check_blend_order gives (rlhf.training.ppo.voice_watch).", "guards")
    voice_check_blend_order: str = opt("last", "Voice check with blends: 'last' tries them only after every "
                                       "checkpoint has lost the voice (a run the check would otherwise refuse); "
                                       "'progress' tries them among the checkpoints, furthest along first, a blend "
                                       "before the checkpoint of equal progress (it learned less on five of six "
                                       "cells: BENCHMARKS.md).", "guards")
    voice_probe_every: int = opt(0, "Voice probe (0 = off): every N steps measure the voice check's views of the "
                                 "policy; each time they have lost the voice, multiply the KL coefficient by "
                                 "ppo.voice_probe_kl (rlhf.training.ppo.voice_watch.VoiceProbe). Needs "
                                 "ppo.voice_check_tokens.", "guards")
    voice_probe_kl: float = opt(4.0, "Voice probe: the factor on the KL coefficient at each loss it finds.",
                                "guards")
    max_guard_events: int = opt(8, "Guard events (skipped minibatches, NaN rewards) before the run fails.", "guards")
    ratio_limit: float = opt(10.0, "Guard: skip a minibatch whose mean policy ratio leaves [1/this, this].", "guards")
    reward_clip: float = opt(10.0, "Clip the scalar reward to +-this.", "shaping")
    whiten_rewards: bool = opt(False, "Whiten the scalar reward over the batch.", "shaping")
    length_target: int = opt(0, "Rule term: preferred reply length in tokens (0 = off).", "shaping")
    length_weight: float = opt(0.0, "Rule term weight for distance from length_target.", "shaping")
    repetition_weight: float = opt(2.0, "Rule term weight penalising repeated n-grams (2 with the relevance and "
                                   "novelty terms keeps the voice: bench loop, #40).", "shaping")
    polite_weight: float = opt(0.0, "Rule term weight for a polite, complete ending.", "shaping")
    relevance_weight: float = opt(2.0, "Penalty per nat that a reply's relevance to its prompt falls short of "
                                  "ppo.relevance_floor. Relevance: the reference model's mean log-prob per token of "
                                  "the reply after its own prompt minus after another prompt of the batch (the "
                                  "guard's off-prompt measure); a reply that fits any question scores about 0.",
                                  "shaping")
    relevance_floor: float = opt(0.5, "Relevance (nats per token) below which ppo.relevance_weight penalises a reply; "
                                 "above it nothing is paid, so short replies gain nothing (the guard's "
                                 "gate.min_relevance is 0.25).", "shaping")
    novelty_weight: float = opt(1.0, "Penalty on the share of a reply's word pairs that the batch's replies to other "
                                "prompts also use (a stock phrase reused whatever the question: what the guard's "
                                "distinct-2 check sees).", "shaping")
    novelty_memory: int = opt(0, "Earlier PPO steps whose rollouts ppo.novelty_weight's term also compares a reply "
                              "with (0 = its own step's only): a stock phrase that spreads across steps is paid "
                              "for before it fills a step.", "shaping")
    reward_functions: dict = opt({}, "Extra rewards: import path 'mod:fn' -> weight; fn(messages, reply) -> float.",
                                 "shaping")
    vote_weight: float = opt(1.0, "Weight of DPO's loss on the decided votes, one batch of them after each PPO update "
                             "(0 = off): pulls the policy toward the replies people chose where its own samples "
                             "seldom reach them (rlhf.training.ppo.votes).", "votes")
    vote_beta: float = opt(0.5, "DPO's beta in ppo.vote_weight's loss (higher: the policy stays nearer the base).",
                           "votes")
    vote_nll_weight: float = opt(0.0, "Weight, inside ppo.vote_weight's loss, of the chosen replies' negative "
                                 "log-likelihood per token (RPO's term, Pang et al. 2024; 0 = DPO's loss alone): "
                                 "holds the policy near replies people chose as written.", "votes")
    vote_smoothing: float = opt(0.0, "cDPO's label smoothing in ppo.vote_weight's loss: each vote read as right "
                                "with probability 1 - this (0 = DPO's loss), so a pair already won is pulled back "
                                "toward a finite margin instead of widened.", "votes")
    vote_batch: int = opt(4, "Decided pairs per step in ppo.vote_weight's loss.", "votes")
    vote_batch_max: int = opt(4, "Most decided pairs per step: ppo.vote_batch is raised up to this when "
                              "ppo.vote_passes passes over the pairs would not fit in ppo.steps (a larger pool "
                              "read as often as a smaller one).", "votes")
    vote_passes: int = opt(2, "Passes over the decided pairs that ppo.vote_weight's steps may make (0 = a step "
                           "after every PPO update): on a small pool each further pass mostly widens margins "
                           "already won while the KL keeps rising (16 votes: 8 vote steps, not 16).", "votes")
    lora_r: int = opt(16, "LoRA rank of the policy adapter.", "adapter")
    lora_alpha: int = opt(32, "LoRA alpha of the policy adapter.", "adapter")
    load_in_4bit: bool = opt(False, "QLoRA: 4-bit NF4 base for the policy (CUDA only).", "adapter")
    eval_prompts: int = opt(32, "Held-out prompts used for evaluation and the gate (fewer: wider intervals).", "run")
    save_every: int = opt(4, "Checkpoint every N steps (0 = only final).", "run")
    eval_every: int = opt(0, "Evaluate every N steps to pick best/ (0 = only at the end).", "run")
    seed: int = opt(0, "Seed for prompts, sampling and init.", "run")
    report_to: str = opt("none", "none | tensorboard | wandb | trackio: mirror metrics there.", "run")

    def check(self) -> None:
        """Raise ConfigError naming the key when a value cannot train (called at load and before a run)."""
        if self.voice_check_tokens < 0:
            raise ConfigError(f"ppo.voice_check_tokens must be >= 0 (0 = off), got {self.voice_check_tokens}")
        if min(self.steps, self.batch_size, self.group_size, self.ppo_epochs, self.max_new_tokens) < 1:
            raise ConfigError("ppo.steps, ppo.batch_size, ppo.group_size, ppo.ppo_epochs and ppo.max_new_tokens "
                              "must be >= 1")
        if not 1 <= self.mini_batch_size <= self.batch_size * self.group_size:
            raise ConfigError("ppo.mini_batch_size must be in 1..ppo.batch_size * ppo.group_size (the replies of "
                              "one rollout)")
        if self.temperature <= 0:
            raise ConfigError("ppo.temperature must be > 0 (PPO needs sampled replies)")
        if self.ratio_limit <= 1 or self.max_guard_events < 1:
            raise ConfigError("ppo.ratio_limit must be > 1 and ppo.max_guard_events >= 1")
        if min(self.vote_weight, self.vote_nll_weight, self.vote_passes) < 0 or self.vote_beta <= 0 \
                or self.vote_batch < 1 or self.vote_batch_max < 1 or not 0 <= self.vote_smoothing < 0.5:
            raise ConfigError("ppo.vote_weight must be >= 0, ppo.vote_nll_weight >= 0, ppo.vote_beta > 0, "
                              "ppo.vote_batch and ppo.vote_batch_max >= 1, ppo.vote_passes >= 0 and "
                              "0 <= ppo.vote_smoothing < 0.5")
        if not 0 <= self.voice_check_blends <= 16:
            raise ConfigError(f"ppo.voice_check_blends must be in 0..16 (0 = off), got {self.voice_check_blends}")
        one_of("ppo.voice_check_blend_order", self.voice_check_blend_order, ("last", "progress"))
        if self.voice_probe_every < 0 or not self.voice_probe_kl >= 1:
            raise ConfigError("ppo.voice_probe_every must be >= 0 (0 = off) and ppo.voice_probe_kl >= 1, got "
                              f"{self.voice_probe_every} and {self.voice_probe_kl}")
        if self.novelty_memory < 0:
            raise ConfigError("ppo.novelty_memory must be >= 0 (earlier steps remembered; 0 = none)")
        if not (self.stop_repetition_rise >= 0 and self.stop_distinct_drop >= 0 and self.stop_window >= 1):
            raise ConfigError("ppo.stop_repetition_rise and ppo.stop_distinct_drop must be >= 0 and "
                              "ppo.stop_window >= 1")
        if not 0 <= self.adversarial_ratio <= 1:
            raise ConfigError(f"ppo.adversarial_ratio must be in [0, 1], got {self.adversarial_ratio}")
        one_of("ppo.advantage", self.advantage, ("group", "gae"))
        if self.advantage == "group":
            if self.group_size < 2:
                raise ConfigError("ppo.advantage=group compares the replies to one prompt: ppo.group_size must be "
                                  ">= 2 (or set ppo.advantage=gae)")
            defaults = {f.name: default_of(f) for f in dataclasses.fields(self)}
            unused = [k for k in GAE_ONLY if getattr(self, k) != defaults[k]]
            if unused:
                raise ConfigError(f"{', '.join('ppo.' + k for k in unused)} only appl"
                                  f"{'ies' if len(unused) == 1 else 'y'} with ppo.advantage=gae (a value head); "
                                  "with ppo.advantage=group nothing reads "
                                  f"{'it' if len(unused) == 1 else 'them'}: remove or set ppo.advantage=gae")

    @property
    def uses_value_head(self) -> bool:
        """GAE needs a value head; group advantages do not."""
        return self.advantage == "gae"


PPO_GROUPS = groups(PPOConfig)  # key -> concern, from the fields themselves


@dataclass
class DPOConfig(Checked):
    """DPO settings (``retrain.method: dpo``): TRL's DPOTrainer on the votes PPO's reward model learns from."""
    beta: float = opt(0.1, "KL strength: higher keeps the policy nearer the version it starts from (Rafailov et al. "
                      "2023, eq. 7).")
    learning_rate: float = opt(5e-4, "LoRA learning rate.")
    epochs: float = opt(3.0, "Passes over the preference pairs.")
    batch_size: int = opt(8, "Pairs per optimizer step.")
    micro_batch_size: int = opt(2, "Pairs per forward pass (gradients accumulate up to batch_size): peak memory "
                                "grows with it, about 1 GB per pair on SmolLM2-135M on CPU.")
    max_length: int = opt(512, "Longest prompt + reply in tokens (the prompt is fitted to ppo.max_prompt_tokens).")
    loss_type: str = opt("sigmoid", "TRL loss: sigmoid (DPO), ipo, hinge, robust, ...")
    lora_r: int = opt(16, "LoRA rank of the policy adapter.")
    lora_alpha: int = opt(32, "LoRA alpha of the policy adapter.")
    seed: int = opt(0, "Seed for the pair order and the adapter's init.")

    def check(self) -> None:
        """Raise ConfigError naming the key when a value cannot train (called at load)."""
        if self.beta <= 0 or self.learning_rate <= 0 or self.epochs <= 0:
            raise ConfigError("dpo.beta, dpo.learning_rate and dpo.epochs must be > 0")
        if min(self.batch_size, self.micro_batch_size, self.lora_r) < 1 or self.max_length < 8:
            raise ConfigError("dpo.batch_size, dpo.micro_batch_size and dpo.lora_r must be >= 1, dpo.max_length >= 8")
        if self.batch_size % self.micro_batch_size:
            raise ConfigError(f"dpo.batch_size ({self.batch_size}) must be a multiple of dpo.micro_batch_size "
                              f"({self.micro_batch_size}): gradients accumulate over whole micro-batches")
        if not self.loss_type.replace("_", "").isalnum():
            raise ConfigError(f"dpo.loss_type must be a TRL DPO loss name such as sigmoid, got {self.loss_type!r}")


@dataclass
class EvalConfig(Checked):
    """How the retrain's evaluation and the eval-samples job generate: defaults = what they borrowed from ppo."""
    max_new_tokens: int = opt(48, "Reply length of the candidate's and the active version's eval replies.")
    temperature: float = opt(1.0, "Sampling temperature of the KL-to-base estimate when PPO did not measure it.")
    reply_temperature: float = opt(0.7, "Temperature of the compared replies the gate, its judge and the "
                                        "reward-hacking guard read: serving.temperature's default, so they read "
                                        "replies as people are served them (0 = greedy, which magnifies a formula "
                                        "nobody hears: at 64 votes the guard published 11 of 16 versions reading "
                                        "greedy replies, 15 of 16 at 0.7; BENCHMARKS.md).")
    max_prompt_tokens: int = opt(384, "Longest eval prompt in tokens; the oldest turns are cut first (the rule "
                                 "rollouts, the reward model and chat use).")
    seed_offset: int = opt(1000, "Eval sampling seed = ppo.seed + this (so eval never replays a rollout's noise).")

    def check(self) -> None:
        """Raise ConfigError naming the key when a value cannot work (called at load)."""
        if min(self.max_new_tokens, self.max_prompt_tokens) < 1 or self.temperature <= 0:
            raise ConfigError("eval.max_new_tokens and eval.max_prompt_tokens must be >= 1, eval.temperature > 0")
        if not 0 <= self.reply_temperature <= 2:
            raise ConfigError(f"eval.reply_temperature must be in [0, 2] (0 = greedy), got {self.reply_temperature}")
