"""Exports of the collected feedback, one function per format, each loadable by its consumer's own tools.

Raw formats (``jsonl``, ``parquet``, ``hf``) hold every feedback event with its full context (system
prompt + branch history), excluded annotators included and marked. Training formats (``trl-preference``,
``kto``, ``openrlhf``, ``verl``) go through ``rlhf.training.data``'s builders and leave excluded annotators out
(config ``reward.exclude_annotators`` plus the annotators excluded in the Store), exactly as training does.
``openrlhf`` and ``verl`` write a directory with a ``LAUNCH.md`` holding the commands to train at
cluster scale on it, and to import the result back with ``rlhf-studio import-policy`` (``rlhf.interop.recipes``
writes them for pinned engine releases).
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from rlhf.config import AppConfig
from rlhf.files import atomic_dir, atomic_file
from rlhf.interop import recipes
from rlhf.base_models import SHIPPED
from rlhf.training.data import Feedback, build_kto, build_pairs
from rlhf.training.prompts import store_states

log = logging.getLogger(__name__)

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
    ("withdraws_id", pa.int64()), ("field", pa.string()),
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
    data_dir: Optional[Path] = None  # where the app keeps converted base models (LAUNCH.md points at them)
    policy_lora: tuple[int, int] = (16, 32)  # ppo.lora_r, ppo.lora_alpha: the LoRA the app trains and serves


def load_source(store, config: AppConfig, agent: Optional[str] = None) -> Source:
    """Feedback rows of one agent, or of every agent when ``agent`` is None."""
    agents = [store.get_agent(agent)] if agent is not None else store.list_agents()
    return Source(agents, {a.name: store.feedback_rows(a.id) for a in agents}, list(config.reward.exclude_annotators),
                  config.reward.margin_per_score, config.reward.rated_vs_unrated, config.data_path,
                  (config.ppo.lora_r, config.ppo.lora_alpha))


# ---- rows ------------------------------------------------------------------------------------------
def event_records(src: Source) -> list[dict]:
    """Every rating, comparison and withdrawal event as one flat record with its full context (EVENT_SCHEMA). A
    withdrawal (a thumb clicked again) names the rating event ``withdraws_id`` whose ``field`` it takes back."""
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
        for w in rows.get("withdrawals") or ():
            msg = fb.messages[w["message_id"]]
            out.append({**blank, "event": "withdrawal", "id": w["id"], "created": w["created"], "agent": agent.name,
                        "annotator": w.get("annotator"), "annotator_excluded": w.get("annotator") in excluded,
                        "conversation_id": msg["conversation_id"], "prompt": fb.prompt(msg["id"]),
                        "message_id": msg["id"], "policy_id": msg.get("policy_id"), "reply": msg["content"],
                        "withdraws_id": w["rating_id"], "field": w["field"]})
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


def base_name_of(src: Source) -> str:
    """The one base model of the exported agents, as the app names it."""
    bases = {a.base_model for a in src.agents}
    if len(bases) != 1:
        raise ExportError(f"the agents use different base models ({', '.join(sorted(bases))}); "
                          "export one with --agent NAME")
    return bases.pop()


def base_model_of(src: Source) -> str:
    """The one base model of the exported agents as a cluster loads it (a shipped name becomes its hub id)."""
    base = base_name_of(src)
    return SHIPPED[base][2] if base in SHIPPED else base


def _model_config(base: str, data_dir: Optional[Path]):
    """The transformers config of a base model from local files only (None when there is none here)."""
    import importlib.util

    from transformers import AutoConfig

    from rlhf.base_models import cached_model_dir

    try:
        if base in SHIPPED:
            converted = cached_model_dir(base, data_dir) if data_dir is not None else None
            if converted is not None and (converted / "config.json").is_file():
                return AutoConfig.from_pretrained(str(converted))
            package, filename, _ = SHIPPED[base]
            spec = importlib.util.find_spec(package)  # does not import it (its __init__ needs `llm`)
            locations = list(spec.submodule_search_locations or []) if spec is not None else []
            if not locations or not (Path(locations[0]) / filename).is_file():
                return None
            return AutoConfig.from_pretrained(locations[0], gguf_file=filename)  # reads the header, no weights
        return AutoConfig.from_pretrained(base, local_files_only=True)
    except Exception as exc:  # an unreadable or unknown config must not fail an export: fall back
        log.info("no local config for %s (%s): assuming attention-projection LoRA targets", base, exc)
        return None


def policy_lora(src: Source) -> recipes.Lora:
    """The LoRA the app's PPO trains on this base: ``rlhf.base_models.lora_targets`` of the model's module tree
    (built on the meta device from its config, no weights) with ``ppo.lora_r`` / ``ppo.lora_alpha``.

    Without a local config (a hub id never downloaded here) the attention projections are assumed, which is
    what ``lora_targets`` picks on every Llama / Mistral / Qwen style model."""
    rank, alpha = src.policy_lora
    cfg = _model_config(base_name_of(src), src.data_dir)
    targets: list[str] | str = ["q_proj", "k_proj", "v_proj", "o_proj"]
    if cfg is not None:
        import torch
        from transformers import AutoModelForCausalLM

        from rlhf.base_models import lora_targets

        try:
            with torch.device("meta"):
                targets = lora_targets(AutoModelForCausalLM.from_config(cfg))
        except Exception as exc:  # not a causal LM transformers can build here: keep the assumption
            log.info("cannot build %s on the meta device (%s): assuming attention-projection targets", cfg, exc)
    return recipes.Lora(rank, alpha, targets)


def recipe_context(src: Source, out: Path) -> recipes.Context:
    """What LAUNCH.md needs: paths, base model, agents and the app's LoRA."""
    name = base_name_of(src)
    converted = None
    if name in SHIPPED and src.data_dir is not None:
        from rlhf.base_models import cached_model_dir

        converted = cached_model_dir(name, src.data_dir)
    return recipes.Context(out, base_model_of(src), [a.name for a in src.agents], policy_lora(src), converted)


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
    (out / "LAUNCH.md").write_text(recipes.openrlhf_launch(recipe_context(src, final or out), len(pairs), len(prompts)))
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
    (out / "LAUNCH.md").write_text(recipes.verl_launch(recipe_context(src, final or out), len(rows["train"]),
                                                       len(rows["test"]), len(pairs)))
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
    with (atomic_dir(out) if fmt in DIRECTORY_FORMATS else atomic_file(out)) as target:
        counts = WRITERS[fmt](src, target, out) if fmt in LAUNCHED else WRITERS[fmt](src, target)
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


def default_name(fmt: str, agent_id: Optional[int] = None) -> str:
    """A file or directory name for an export made for download. Built from the format (one of ``FORMATS``) and
    the agent's id only: never from text a user typed, so no name can point outside the export directory."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    if agent_id is not None and (isinstance(agent_id, bool) or not isinstance(agent_id, int)):
        raise ExportError(f"agent id must be an integer, got {agent_id!r}")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    who = "all" if agent_id is None else f"agent{agent_id}"
    return f"rlhf-studio-{who}-{fmt}-{stamp}{SUFFIX.get(fmt, '')}"
