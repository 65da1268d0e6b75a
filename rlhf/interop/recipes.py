"""The ``LAUNCH.md`` of the ``openrlhf`` and ``verl`` exports: cluster commands for pinned engine releases.

Engines rename their command-line flags and config keys between releases (OpenRLHF 0.11 moved every flag
under a dotted group: ``--pretrain`` became ``--actor.model_name_or_path``), so each recipe names the one
release it was checked against. ``tests/rlhf/interop/test_recipes.py`` downloads exactly these releases from
PyPI and checks every flag against the argparse definitions in ``openrlhf/cli/train_rm.py`` and
``train_ppo_ray.py``, every ``key=value`` against verl's shipped Hydra trainer config, every ``trl`` flag
against the installed ``trl reward``, and loads the exported files with the engines' own dataset classes.
Change a version here only together with a run of those tests.

Batch sizes follow the data: a global batch is a power of two and a multiple of one micro-batch on every GPU
(``MICRO`` x ``GPUS``), at most the number of rows, since both engines drop an incomplete last batch. An
export with fewer rows than one such batch gets a ``LAUNCH.md`` that says so instead of a command.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

OPENRLHF_VERSION = "0.11.2"
VERL_VERSION = "0.9.1"
TRL_VERSION = "1.16.0"  # the app's pinned TRL: its `trl reward` trains the reward model of the verl recipe

GPUS = 8  # one node; every recipe states this and how to change it
MICRO = 4  # rows per GPU per forward pass
MIN_BATCH = GPUS * MICRO


@dataclass
class Lora:
    """The LoRA the app's PPO trains: ``rlhf.models.lora_targets`` on the base, ``ppo.lora_r`` / ``ppo.lora_alpha``."""

    rank: int
    alpha: int
    targets: list[str] | str  # module names, or "all-linear"


@dataclass
class Context:
    """What both recipes need to know about the export."""

    out: Path  # the export directory as the user will see it
    base: str  # hub id or path the cluster loads
    agents: list[str]
    lora: Lora
    converted_base: Optional[Path] = None  # the app's copy of a shipped GGUF base, converted to safetensors

    @property
    def agent(self) -> str:
        return self.agents[0] if len(self.agents) == 1 else "NAME"


def global_batch(rows: int, cap: int) -> Optional[int]:
    """The largest power-of-two batch <= min(rows, cap) that fills every GPU's micro-batch; None if rows are too few."""
    batch = cap
    while batch >= MIN_BATCH:
        if batch <= rows:
            return batch
        batch //= 2
    return None


def _targets_text(lora: Lora, sep: str) -> str:
    return lora.targets if isinstance(lora.targets, str) else sep.join(lora.targets)


def _too_little(have: int, unit: str, consequence: str) -> str:
    return (f"**Too little data for this step yet:** {have} {unit} in this export, and one global batch on {GPUS} "
            f"GPUs (micro-batch {MICRO} per GPU) takes {MIN_BATCH}; {consequence}. Collect more feedback and export "
            "again, or train in the app (Training tab), which works from a handful of pairs.\n")


DROPS = "the engine drops an incomplete batch, so it would not take a single step"


def _preamble(ctx: Context) -> str:
    text = f"""Copy this directory to storage every node sees, then set:

```bash
export EXPORT_DIR={ctx.out}
export CKPT_DIR=$PWD/checkpoint
export BASE_MODEL={ctx.base}
```

Sizes assume one node with {GPUS} GPUs and a micro-batch of {MICRO} rows per GPU. For another count, scale
the `num_gpus_per_node` / `n_gpus_per_node` / `--num_processes` values and keep every global batch a
multiple of micro-batch x GPUs.
"""
    if ctx.converted_base is not None:
        text += f"""
The app serves its base converted from a 4-bit GGUF (`{ctx.converted_base}`, written at the app's first
start); `BASE_MODEL` above is the original on the Hugging Face hub. For a policy whose imported change is
the training's only, copy the app's converted directory to the cluster and point `BASE_MODEL` at it.
"""
    return text


# ---- OpenRLHF -----------------------------------------------------------------------------------------------
def openrlhf_launch(ctx: Context, n_pairs: int, n_prompts: int) -> str:
    """Reward model (DeepSpeed) and PPO (Ray + vLLM) with OpenRLHF, then the import back into the app."""
    rm_batch = global_batch(n_pairs, 128)  # DeepSpeed: train_batch_size = micro x GPUs x accumulation
    ppo_rollout = global_batch(n_prompts, 1024)
    head = f"""# Train at cluster scale with OpenRLHF {OPENRLHF_VERSION}

Written for and checked against **OpenRLHF {OPENRLHF_VERSION}** (`pip install "openrlhf[vllm]=={OPENRLHF_VERSION}"`):
every flag below is defined by that release's `openrlhf/cli/train_rm.py` and `train_ppo_ray.py`, and its
own `RewardDataset` / `PromptDataset` read these files. Other releases rename flags; install this one.

Exported by RLHF Studio from agent(s) {', '.join(ctx.agents)} on base model `{ctx.base}`:
- `rm_pairs.jsonl`: {n_pairs} reward-model pairs (`prompt` message list, `chosen` / `rejected` assistant
  messages, `margin` from the score difference; `--model.margin_loss_enable` uses it)
- `prompts.jsonl`: {n_prompts} PPO prompts (`context_messages` message lists)

{_preamble(ctx)}
## 1. Reward model (DeepSpeed)

"""
    if rm_batch is None:
        rm = _too_little(n_pairs, "preference pairs", DROPS)
    else:
        rm = f"""
```bash
deepspeed --module openrlhf.cli.train_rm \\
   --model.model_name_or_path $BASE_MODEL \\
   --data.dataset $EXPORT_DIR/rm_pairs.jsonl \\
   --data.prompt_key prompt --data.chosen_key chosen --data.rejected_key rejected \\
   --data.apply_chat_template --data.max_len 2048 \\
   --model.margin_loss_enable \\
   --ckpt.output_dir $CKPT_DIR/rlhf-studio-rm \\
   --train.max_epochs 1 --train.batch_size {rm_batch} --train.micro_batch_size {MICRO} \\
   --adam.lr 9e-6 --ds.zero_stage 2 --ds.param_dtype bf16 --model.gradient_checkpointing_enable
```

The reward model is a full fine-tune saved as a Hugging Face sequence-classification model (value head
`score`); step 2 loads it from `$CKPT_DIR/rlhf-studio-rm`.
"""
    ppo = "\n## 2. PPO (Ray, vLLM rollouts; all models share the GPUs)\n\n"
    if rm_batch is None:
        ppo += "PPO needs the reward model of step 1.\n\n"
    if ppo_rollout is None:
        ppo += _too_little(n_prompts, "prompts", DROPS)
    ready = rm_batch is not None and ppo_rollout is not None
    if ready:
        train_batch = min(ppo_rollout, 128)
        targets = _targets_text(ctx.lora, ",")
        ppo += f"""```bash
ray start --head --num-gpus {GPUS}
ray job submit --address="http://127.0.0.1:8265" \\
   -- python3 -m openrlhf.cli.train_ppo_ray \\
   --ref.num_nodes 1 --ref.num_gpus_per_node {GPUS} \\
   --reward.num_nodes 1 --reward.num_gpus_per_node {GPUS} \\
   --critic.num_nodes 1 --critic.num_gpus_per_node {GPUS} \\
   --actor.num_nodes 1 --actor.num_gpus_per_node {GPUS} \\
   --vllm.num_engines {GPUS} --vllm.tensor_parallel_size 1 --vllm.gpu_memory_utilization 0.5 \\
   --train.colocate_all --vllm.enable_sleep --ds.enable_sleep \\
   --actor.model_name_or_path $BASE_MODEL \\
   --reward.model_name_or_path $CKPT_DIR/rlhf-studio-rm \\
   --data.prompt_dataset $EXPORT_DIR/prompts.jsonl \\
   --data.input_key context_messages --data.apply_chat_template \\
   --ckpt.output_dir $CKPT_DIR/rlhf-studio-ppo \\
   --rollout.batch_size {ppo_rollout} --rollout.micro_batch_size {MICRO} \\
   --train.batch_size {train_batch} --train.micro_batch_size {MICRO} \\
   --data.max_len 2048 --rollout.max_new_tokens 512 --train.max_epochs 1 --train.num_episodes 1 \\
   --actor.adam.lr 5e-7 --critic.adam.lr 9e-6 --algo.kl.init_coef 0.01 \\
   --ds.zero_stage 2 --ds.param_dtype bf16 --reward.normalize_enable \\
   --actor.gradient_checkpointing_enable
```

Paths are absolute on purpose: a Ray job runs in its own working directory. `--reward.normalize_enable`
uses the mean and spread that `train_rm` measures on 1% of the pairs (none under 100 pairs: rewards are then
used as they are).

**Why full parameters, not a LoRA:** OpenRLHF {OPENRLHF_VERSION} generates rollouts only with vLLM, and its
weight sync (`broadcast_to_vllm`) sends the actor's parameters by name; with `--ds.lora.rank` set those are
PEFT names (`base_model.model...lora_A.default.weight`) that vLLM's loader does not know, so the run fails at
the first sync (upstream issue OpenRLHF#1349, open). The app's own policies are rank-{ctx.lora.rank} LoRAs on
`{targets}`; the import below turns the trained model into exactly that adapter. Once OpenRLHF syncs LoRA
weights, `--ds.lora.rank {ctx.lora.rank} --ds.lora.alpha {ctx.lora.alpha}{_openrlhf_targets(ctx.lora)}`
trains it directly and `import-policy` takes the saved adapter as is.

## 3. Back into RLHF Studio

```bash
rlhf-studio import-policy $CKPT_DIR/rlhf-studio-ppo --agent {ctx.agent} --rank {ctx.lora.rank} --targets {targets}
```

The full model becomes a rank-{ctx.lora.rank} LoRA on `{targets}` of the agent's base (best rank-r
approximation of each weight change; the reconstruction error and the change outside those modules are
printed and stored with the version) and is registered as a candidate version. Promote it from the Dashboard
when it wins. (`import-policy` also takes an OpenRLHF LoRA save, the `adapter_config.json` +
`adapter_model.safetensors` or `.bin` + `config.json` directory `save_model` writes, as is.)
"""
    return head + rm + ppo


def _openrlhf_targets(lora: Lora) -> str:
    # `--ds.lora.target_modules` takes names (nargs="*"); left out, OpenRLHF's default is the string "all-linear".
    return "" if isinstance(lora.targets, str) else " --ds.lora.target_modules " + " ".join(lora.targets)


# ---- verl ---------------------------------------------------------------------------------------------------
def verl_launch(ctx: Context, n_train: int, n_test: int, n_pairs: int) -> str:
    """Reward model (TRL) and PPO with a LoRA actor in verl, the merge to a Hugging Face directory, and the import."""
    rm_ok = n_pairs >= MIN_BATCH
    train_batch = global_batch(n_train, 256)
    head = f"""# Train at cluster scale with verl {VERL_VERSION}

Written for and checked against **verl {VERL_VERSION}** (`pip install "verl[vllm]=={VERL_VERSION}"`): every
`key=value` below exists in that release's trainer config (`verl/trainer/config/ppo_trainer.yaml` and the
files its Hydra defaults compose), and its own `RLHFDataset` reads `train.parquet`. The reward model is
trained with **TRL {TRL_VERSION}** (`trl reward`, the TRL this app pins), whose flags are checked the same way.

Exported by RLHF Studio from agent(s) {', '.join(ctx.agents)} on base model `{ctx.base}`:
`train.parquet` ({n_train} prompts) and `test.parquet` ({n_test}) in verl's RL schema (`data_source`,
`prompt` as chat messages, `ability`, `reward_model` {{style: model}}, `extra_info`), and `rm/train.parquet`
({n_pairs} preference pairs: `prompt`, `chosen`, `rejected`, `margin`) for the reward model.

{_preamble(ctx)}
## 1. Reward model (TRL; `trl` runs it under `accelerate launch`)

"""
    if not rm_ok:
        rm = _too_little(n_pairs, "preference pairs", "TRL would repeat the few pairs to fill every GPU's "
                         "batch, and a reward model from so few says little")
    else:
        rm = f"""
```bash
trl reward --model_name_or_path $BASE_MODEL \\
   --dataset_name $EXPORT_DIR/rm --output_dir $CKPT_DIR/rlhf-studio-rm \\
   --num_train_epochs 1 --per_device_train_batch_size {MICRO} --learning_rate 1e-5 \\
   --max_length 2048 --bf16 true --num_processes {GPUS}
```

`--num_processes` goes to `accelerate launch` (one process per GPU). `--bf16` takes a value in TRL
{TRL_VERSION}. Pairs longer than `--max_length` tokens are dropped, not cut. The result is a full
sequence-classification model, which verl serves with vLLM to score rollouts.
"""
    ppo = "\n## 2. PPO (a LoRA actor: the app's rank, alpha and target modules)\n\n"
    if not rm_ok:
        ppo += "PPO needs the reward model of step 1.\n\n"
    if train_batch is None:
        ppo += _too_little(n_train, "training prompts", DROPS)
    if n_test < 1:
        ppo += "\nverl also needs at least one validation prompt in `test.parquet`; this export has none.\n"
    if not (rm_ok and train_batch is not None and n_test >= 1):
        return head + rm + ppo
    mini = min(train_batch, 64)
    targets = _targets_text(ctx.lora, ",")
    target_value = targets if isinstance(ctx.lora.targets, str) else f"[{targets}]"
    ppo += f"""```bash
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=gae \\
    data.train_files=$EXPORT_DIR/train.parquet \\
    data.val_files=$EXPORT_DIR/test.parquet \\
    data.train_batch_size={train_batch} data.max_prompt_length=1024 data.max_response_length=512 \\
    data.filter_overlong_prompts=True \\
    actor_rollout_ref.model.path=$BASE_MODEL \\
    actor_rollout_ref.model.lora_rank={ctx.lora.rank} actor_rollout_ref.model.lora_alpha={ctx.lora.alpha} \\
    'actor_rollout_ref.model.target_modules={target_value}' \\
    actor_rollout_ref.actor.optim.lr=1e-5 \\
    actor_rollout_ref.actor.ppo_mini_batch_size={mini} \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO} \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO} \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO} \\
    critic.model.path=$BASE_MODEL critic.optim.lr=1e-5 critic.ppo_micro_batch_size_per_gpu={MICRO} \\
    reward.reward_model.enable=True \\
    reward.reward_model.model_path=$CKPT_DIR/rlhf-studio-rm \\
    reward.reward_model.rollout.name=vllm \\
    reward.reward_model.rollout.tensor_model_parallel_size=1 \\
    reward.reward_model.rollout.gpu_memory_utilization=0.2 \\
    algorithm.kl_ctrl.kl_coef=0.001 \\
    'trainer.logger=[console]' trainer.project_name=rlhf-studio trainer.experiment_name={ctx.agent} \\
    trainer.n_gpus_per_node={GPUS} trainer.nnodes=1 \\
    trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=1 \\
    trainer.default_local_dir=$CKPT_DIR/rlhf-studio-verl
```

`trainer.save_freq` must be positive: verl saves a checkpoint only then (always including the last step).

## 3. Back into RLHF Studio

verl saves FSDP shards; merge the last one into a Hugging Face directory, then import it:

```bash
STEP=$(cat $CKPT_DIR/rlhf-studio-verl/latest_checkpointed_iteration.txt)
python3 -m verl.model_merger merge --backend fsdp \\
    --local_dir $CKPT_DIR/rlhf-studio-verl/global_step_$STEP/actor \\
    --target_dir $CKPT_DIR/rlhf-studio-verl-hf
rlhf-studio import-policy $CKPT_DIR/rlhf-studio-verl-hf --agent {ctx.agent}
```

With a LoRA actor the merger writes the untouched base next to `lora_adapter/` (`adapter_config.json` +
`adapter_model.safetensors`); `import-policy` registers that adapter (rank {ctx.lora.rank} on `{targets}`) as a
candidate version as is. A full-parameter run (`actor_rollout_ref.model.lora_rank=0`) merges to a plain model
directory instead, which `import-policy ... --rank {ctx.lora.rank} --targets {targets}` turns into the same
kind of adapter. Promote it from the Dashboard when it wins.
"""
    return head + rm + ppo
