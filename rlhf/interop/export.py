"""Exports of the collected feedback, one function per format, each loadable by its consumer's own tools.

Raw formats (``jsonl``, ``parquet``, ``hf``) hold every feedback event with its full context (system
prompt + branch history), excluded annotators included and marked. Training formats (``trl-preference``,
``kto``, ``openrlhf``, ``verl``) go through ``rlhf.training.data``'s builders and leave excluded annotators out
(config ``reward.exclude_annotators`` plus the annotators excluded in the Store), exactly as training does.
``openrlhf`` and ``verl`` write a directory with a ``LAUNCH.md`` holding the commands to train at
cluster scale on it, and to import the result back with ``rlhf-studio import-policy``.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from rlhf.config import AppConfig
from rlhf.training.data import Feedback, build_kto, build_pairs
from rlhf.models import SHIPPED
from rlhf.training.prompts import store_states

FORMATS = ("jsonl", "parquet", "hf", "trl-preference", "kto", "openrlhf", "verl")
DIRECTORY_FORMATS = ("hf", "openrlhf", "verl")
LAUNCHED = ("openrlhf", "verl")  # these also write LAUNCH.md, which names the final directory
SUFFIX = {"jsonl": ".jsonl", "parquet": ".parquet", "trl-preference": ".jsonl", "kto": ".jsonl"}

_MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
EVENT_SCHEMA = pa.schema([
    ("event", pa.string()), ("id", pa.int64()), ("created", pa.string()), ("agent", pa.string()),
    ("annotator", pa.string()), ("annotator_excluded", pa.bool_()), ("conversation_id", pa.int64()),
    ("prompt", _MESSAGES), ("message_id", pa.int64()), ("policy_id", pa.int64()), ("reply", pa.string()),
    ("thumb", pa.int64()), ("score", pa.int64()), ("flags", pa.list_(pa.string())), ("note", pa.string()),
    ("message_b_id", pa.int64()), ("policy_b_id", pa.int64()), ("reply_b", pa.string()), ("winner", pa.string()),
    ("same_context", pa.bool_()), ("pair_id", pa.string()),
])
VERL_SCHEMA = pa.schema([
    ("data_source", pa.string()), ("prompt", _MESSAGES), ("ability", pa.string()),
    ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
    ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64()), ("agent", pa.string()),
                              ("context_key", pa.string()), ("low_rated", pa.bool_())])),
])
RM_SCHEMA = pa.schema([("prompt", _MESSAGES), ("chosen", _MESSAGES), ("rejected", _MESSAGES),
                       ("margin", pa.float64())])


class ExportError(RuntimeError):
    """An export that cannot be written as asked (bad format, target in the way, no token for the hub)."""


@dataclass
class ExportResult:
    """What an export wrote: the path (file or directory), its files, and row counts."""

    format: str
    path: Path
    files: list[str] = field(default_factory=list)
    counts: dict = field(default_factory=dict)


@dataclass
class Source:
    """The feedback of the agents being exported, with what the formats need to know about them."""

    agents: list  # storage.Agent records
    rows: dict  # agent name -> Store.feedback_rows(agent)
    exclude: list  # config's reward.exclude_annotators (the Store's excluded names ride in each rows dict)
    margin_per_score: float
    rated_vs_unrated: bool


def load_source(store, config: AppConfig, agent: Optional[str] = None) -> Source:
    """Feedback rows of one agent, or of every agent when ``agent`` is None."""
    agents = [store.get_agent(agent)] if agent is not None else store.list_agents()
    return Source(agents, {a.name: store.feedback_rows(a.id) for a in agents}, list(config.reward.exclude_annotators),
                  config.reward.margin_per_score, config.reward.rated_vs_unrated)


# ---- rows ------------------------------------------------------------------------------------------
def event_records(src: Source) -> list[dict]:
    """Every rating and comparison event as one flat record with its full context (EVENT_SCHEMA)."""
    out = []
    for agent in src.agents:
        rows = src.rows[agent.name]
        fb = Feedback(rows)  # validated and indexed; no exclusion: raw exports keep everything
        excluded = set(src.exclude) | set(rows.get("excluded_annotators") or [])
        blank = {k: None for k in EVENT_SCHEMA.names}
        for r in rows["ratings"]:
            msg = fb.messages[r["message_id"]]
            out.append({**blank, "event": "rating", "id": r["id"], "created": r["created"], "agent": agent.name,
                        "annotator": r.get("annotator"), "annotator_excluded": r.get("annotator") in excluded,
                        "conversation_id": msg["conversation_id"], "prompt": fb.prompt(msg["id"]),
                        "message_id": msg["id"], "policy_id": msg.get("policy_id"), "reply": msg["content"],
                        "thumb": r.get("thumb"), "score": r.get("score"), "flags": r.get("flags"),
                        "note": r.get("note")})
        for c in rows["comparisons"]:
            a, b = fb.messages[c["message_a_id"]], fb.messages[c["message_b_id"]]
            out.append({**blank, "event": "comparison", "id": c["id"], "created": c["created"], "agent": agent.name,
                        "annotator": c.get("annotator"), "annotator_excluded": c.get("annotator") in excluded,
                        "conversation_id": a["conversation_id"], "prompt": fb.prompt(a["id"]), "message_id": a["id"],
                        "policy_id": c.get("policy_a_id"), "reply": a["content"], "message_b_id": b["id"],
                        "policy_b_id": c.get("policy_b_id"), "reply_b": b["content"], "winner": c["winner"],
                        "same_context": a["context_key"] == b["context_key"], "pair_id": c.get("pair_id")})
    return sorted(out, key=lambda r: (r["created"], r["event"], r["id"]))


def _assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def preference_rows(src: Source) -> list[dict]:
    """Conversational preference rows ``{prompt, chosen, rejected, margin}`` (TRL and OpenRLHF read these)."""
    out = []
    for agent in src.agents:
        for p in build_pairs(src.rows[agent.name], src.exclude, src.margin_per_score, src.rated_vs_unrated):
            out.append({"prompt": p["prompt"], "chosen": _assistant(p["chosen"]),
                        "rejected": _assistant(p["rejected"]), "margin": float(p["margin"])})
    return out


def kto_rows(src: Source) -> list[dict]:
    """Unpaired rows ``{prompt, completion, label}`` (TRL's KTOTrainer format)."""
    out = []
    for agent in src.agents:
        for r in build_kto(src.rows[agent.name], src.exclude):
            out.append({"prompt": r["prompt"], "completion": _assistant(r["completion"]), "label": bool(r["label"])})
    return out


def prompt_states(src: Source) -> list[tuple[str, object]]:
    """(agent name, PromptState) for every distinct conversation state that ends with a user turn."""
    return [(agent.name, s) for agent in src.agents for s in store_states(src.rows[agent.name])]


def held_out(key: str, fraction: float = 0.1) -> bool:
    """A stable train/test assignment of a context (by a hash of its key)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < fraction


def base_model_of(src: Source) -> str:
    """The one base model of the exported agents (a shipped name becomes its hub id)."""
    bases = {a.base_model for a in src.agents}
    if len(bases) != 1:
        raise ExportError(f"the agents use different base models ({', '.join(sorted(bases))}); "
                          "export one with --agent NAME")
    base = bases.pop()
    return SHIPPED[base][2] if base in SHIPPED else base


# ---- writers ---------------------------------------------------------------------------------------
def _write_jsonl(rows: list[dict], path: Path) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _write_parquet(rows: list[dict], schema: pa.Schema, path: Path) -> None:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def export_jsonl(src: Source, out: Path) -> dict:
    """All feedback, one JSON record per event with full context."""
    rows = event_records(src)
    _write_jsonl(rows, out)
    return {"events": len(rows)}


def export_parquet(src: Source, out: Path) -> dict:
    """The jsonl records as one Parquet table (nested prompt messages kept as a list of structs)."""
    rows = event_records(src)
    _write_parquet(rows, EVENT_SCHEMA, out)
    return {"events": len(rows)}


def export_hf(src: Source, out: Path) -> dict:
    """The event records as a ``datasets.Dataset`` saved with ``save_to_disk`` (``load_from_disk`` reads it)."""
    from datasets import Dataset

    rows = event_records(src)
    Dataset(pa.Table.from_pylist(rows, schema=EVENT_SCHEMA)).save_to_disk(str(out))
    return {"events": len(rows)}


def export_trl_preference(src: Source, out: Path) -> dict:
    """``{prompt, chosen, rejected, margin}`` JSONL in TRL's conversational format (RewardTrainer, DPOTrainer)."""
    rows = preference_rows(src)
    _write_jsonl(rows, out)
    return {"pairs": len(rows)}


def export_kto(src: Source, out: Path) -> dict:
    """``{prompt, completion, label}`` JSONL (KTOTrainer)."""
    rows = kto_rows(src)
    _write_jsonl(rows, out)
    return {"rows": len(rows)}


def export_openrlhf(src: Source, out: Path, final: Optional[Path] = None) -> dict:
    """``rm_pairs.jsonl`` (reward model: prompt/chosen/rejected message lists), ``prompts.jsonl``
    (PPO prompts under ``context_messages``) and ``LAUNCH.md``."""
    pairs = preference_rows(src)
    prompts = [{"context_messages": s.as_messages(), "agent": name} for name, s in prompt_states(src)]
    _write_jsonl(pairs, out / "rm_pairs.jsonl")
    _write_jsonl(prompts, out / "prompts.jsonl")
    (out / "LAUNCH.md").write_text(openrlhf_launch(final or out, base_model_of(src), src, len(pairs), len(prompts)))
    return {"pairs": len(pairs), "prompts": len(prompts)}


def export_verl(src: Source, out: Path, final: Optional[Path] = None) -> dict:
    """``train.parquet`` / ``test.parquet`` in verl's RL schema, ``rm/train.parquet`` pairs, and ``LAUNCH.md``."""
    rows = {"train": [], "test": []}
    for name, state in prompt_states(src):
        split = "test" if held_out(state.key) else "train"
        rows[split].append({
            "data_source": f"rlhf-studio/{name}", "prompt": state.as_messages(), "ability": "alignment",
            # A learned reward model scores the replies; there is no reference answer to match.
            "reward_model": {"style": "model", "ground_truth": ""},
            "extra_info": {"split": split, "index": len(rows[split]), "agent": name, "context_key": state.key,
                           "low_rated": state.low_rated}})
    if not rows["test"] and len(rows["train"]) > 1:  # verl wants a validation file: lend it one prompt
        moved = rows["train"].pop()
        moved["extra_info"] = {**moved["extra_info"], "split": "test", "index": 0}
        rows["test"].append(moved)
    for split, items in rows.items():
        _write_parquet(items, VERL_SCHEMA, out / f"{split}.parquet")
    pairs = preference_rows(src)
    (out / "rm").mkdir()
    _write_parquet(pairs, RM_SCHEMA, out / "rm" / "train.parquet")
    (out / "LAUNCH.md").write_text(verl_launch(final or out, base_model_of(src), src, len(rows["train"]), len(rows["test"]),
                                               len(pairs)))
    return {"train": len(rows["train"]), "test": len(rows["test"]), "pairs": len(pairs)}


WRITERS: dict[str, Callable[..., dict]] = {
    "jsonl": export_jsonl, "parquet": export_parquet, "hf": export_hf, "trl-preference": export_trl_preference,
    "kto": export_kto, "openrlhf": export_openrlhf, "verl": export_verl}


def export(store, config: AppConfig, fmt: str, out: str | Path, agent: Optional[str] = None,
           push_to_hub: Optional[str] = None) -> ExportResult:
    """Write one format to ``out`` (a file, or a new directory for hf/openrlhf/verl); optionally push hf to the hub."""
    if fmt not in WRITERS:
        raise ExportError(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    if push_to_hub and fmt != "hf":
        raise ExportError("--push-to-hub works with --format hf")
    if push_to_hub and not config.server.hf_token:
        raise ExportError("--push-to-hub needs a Hugging Face token: set HF_TOKEN (or server.hf_token)")
    out = Path(out).expanduser().resolve()
    if out.exists() and (fmt in DIRECTORY_FORMATS and (not out.is_dir() or any(out.iterdir()))):
        raise ExportError(f"{out} exists and is not an empty directory")
    if out.exists() and fmt not in DIRECTORY_FORMATS and out.is_dir():
        raise ExportError(f"{out} is a directory; the {fmt} format writes one file")
    src = load_source(store, config, agent)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Write beside the target, then rename: a failed export leaves nothing half-written behind.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        target = tmp / "out"
        if fmt in DIRECTORY_FORMATS and fmt != "hf":
            target.mkdir()
        counts = WRITERS[fmt](src, target, out) if fmt in LAUNCHED else WRITERS[fmt](src, target)
        if out.exists():
            out.rmdir() if out.is_dir() else out.unlink()
        target.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) if out.is_dir() else [out.name]
    result = ExportResult(fmt, out, files, counts)
    if push_to_hub:
        from datasets import load_from_disk

        load_from_disk(str(out)).push_to_hub(push_to_hub, token=config.server.hf_token, private=True)
        result.counts["pushed_to"] = push_to_hub
    return result


def archive(result: ExportResult, dest_dir: str | Path) -> Path:
    """The export as one downloadable file: itself, or a zip of its directory."""
    if result.path.is_file():
        return result.path
    base = Path(dest_dir) / result.path.name
    return Path(shutil.make_archive(str(base), "zip", root_dir=result.path))


def default_name(fmt: str, agent: Optional[str]) -> str:
    """A file or directory name for an export made for download."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"rlhf-studio-{agent or 'all'}-{fmt}-{stamp}{SUFFIX.get(fmt, '')}"


# ---- LAUNCH.md -------------------------------------------------------------------------------------
def _agents_line(src: Source) -> str:
    return ", ".join(a.name for a in src.agents)


def openrlhf_launch(out: Path, base: str, src: Source, n_pairs: int, n_prompts: int) -> str:
    """Commands to train a reward model and a PPO policy with OpenRLHF on this export, and import it back."""
    agent = src.agents[0].name if len(src.agents) == 1 else "NAME"
    return f"""# Train at cluster scale with OpenRLHF

Exported by RLHF Studio from agent(s) {_agents_line(src)} on base model `{base}`:
`rm_pairs.jsonl` ({n_pairs} reward-model pairs: `prompt` message list, `chosen` / `rejected` assistant
messages, `margin`) and `prompts.jsonl` ({n_prompts} PPO prompts as `context_messages`).
Copy this directory to shared storage the cluster sees, then set `EXPORT_DIR` to it.

```bash
export EXPORT_DIR={out}
```

## 1. Reward model (DeepSpeed)

```bash
deepspeed --module openrlhf.cli.train_rm \\
   --pretrain {base} \\
   --dataset $EXPORT_DIR/rm_pairs.jsonl \\
   --prompt_key prompt --chosen_key chosen --rejected_key rejected --apply_chat_template \\
   --save_path ./checkpoint/rlhf-studio-rm \\
   --max_len 2048 --max_epochs 1 --train_batch_size 64 --micro_train_batch_size 4 \\
   --learning_rate 9e-6 --zero_stage 2 --param_dtype bf16 --gradient_checkpointing
```

## 2. PPO with Ray (LoRA policy, so the result imports as a light adapter)

```bash
ray start --head --num-gpus 8
ray job submit --address="http://127.0.0.1:8265" \\
   --runtime-env-json='{{"working_dir": "."}}' \\
   -- python3 -m openrlhf.cli.train_ppo_ray \\
   --ref_num_nodes 1 --ref_num_gpus_per_node 2 \\
   --reward_num_nodes 1 --reward_num_gpus_per_node 2 \\
   --critic_num_nodes 1 --critic_num_gpus_per_node 2 \\
   --actor_num_nodes 1 --actor_num_gpus_per_node 2 \\
   --vllm_num_engines 2 --vllm_tensor_parallel_size 1 \\
   --pretrain {base} \\
   --reward_pretrain ./checkpoint/rlhf-studio-rm \\
   --prompt_data $EXPORT_DIR/prompts.jsonl --input_key context_messages --apply_chat_template \\
   --save_path ./checkpoint/rlhf-studio-ppo \\
   --lora_rank 16 --lora_alpha 32 --target_modules q_proj k_proj v_proj o_proj \\
   --train_batch_size 128 --rollout_batch_size 512 --micro_train_batch_size 4 --micro_rollout_batch_size 8 \\
   --prompt_max_len 1024 --generate_max_len 512 --max_epochs 1 \\
   --actor_learning_rate 5e-7 --critic_learning_rate 9e-6 --init_kl_coef 0.01 \\
   --zero_stage 2 --param_dtype bf16 --normalize_reward --gradient_checkpointing
```

Older OpenRLHF releases spell `--param_dtype bf16` as `--bf16`.

## 3. Back into RLHF Studio

```bash
rlhf-studio import-policy ./checkpoint/rlhf-studio-ppo --agent {agent}
```

A PEFT adapter is registered as a candidate version as is; a full model directory of the same
architecture is turned into a LoRA adapter first (`--rank`). Promote it from the Dashboard when it wins.
"""


def verl_launch(out: Path, base: str, src: Source, n_train: int, n_test: int, n_pairs: int) -> str:
    """Commands to train a reward model and run verl PPO on this export, and import the result back."""
    agent = src.agents[0].name if len(src.agents) == 1 else "NAME"
    return f"""# Train at cluster scale with verl

Exported by RLHF Studio from agent(s) {_agents_line(src)} on base model `{base}`:
`train.parquet` ({n_train} prompts) and `test.parquet` ({n_test}) in verl's RL schema (`data_source`,
`prompt` as chat messages, `ability`, `reward_model` {{style: model}}, `extra_info`), and `rm/train.parquet`
({n_pairs} preference pairs: `prompt`, `chosen`, `rejected`, `margin`) for the reward model.

```bash
export EXPORT_DIR={out}
```

## 1. Reward model (TRL; `trl` runs it under `accelerate launch`)

```bash
trl reward --model_name_or_path {base} \\
   --dataset_name $EXPORT_DIR/rm --output_dir ./checkpoint/rlhf-studio-rm \\
   --num_train_epochs 1 --per_device_train_batch_size 4 --learning_rate 1e-5 --bf16 \\
   --num_processes 8
```

(`--num_processes` is handed to `accelerate launch`: one process per GPU.)

## 2. PPO

```bash
python3 -m verl.trainer.main_ppo \\
    data.train_files=$EXPORT_DIR/train.parquet \\
    data.val_files=$EXPORT_DIR/test.parquet \\
    data.prompt_key=prompt data.return_raw_chat=True \\
    data.train_batch_size=256 data.max_prompt_length=1024 data.max_response_length=512 \\
    actor_rollout_ref.model.path={base} \\
    actor_rollout_ref.actor.optim.lr=1e-6 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \\
    critic.model.path={base} critic.optim.lr=1e-5 critic.ppo_micro_batch_size_per_gpu=4 \\
    reward_model.enable=True \\
    reward_model.model.path=./checkpoint/rlhf-studio-rm \\
    reward_model.micro_batch_size_per_gpu=4 \\
    algorithm.kl_ctrl.kl_coef=0.001 \\
    trainer.logger=['console'] trainer.n_gpus_per_node=8 trainer.nnodes=1 \\
    trainer.save_freq=-1 trainer.test_freq=5 trainer.total_epochs=1 \\
    trainer.default_local_dir=./checkpoint/rlhf-studio-verl
```

## 3. Back into RLHF Studio

verl saves FSDP shards; merge the last step into a Hugging Face model directory, then import it:

```bash
python -m verl.model_merger merge --backend fsdp \\
    --local_dir ./checkpoint/rlhf-studio-verl/global_step_N/actor \\
    --target_dir ./checkpoint/rlhf-studio-verl-hf
rlhf-studio import-policy ./checkpoint/rlhf-studio-verl-hf --agent {agent} --rank 16
```

The full model is turned into a rank-16 LoRA adapter on `{base}` (the reconstruction error is printed)
and registered as a candidate version. Promote it from the Dashboard when it wins.
"""
