"""A version's model card (README.md): what it is, what it learned from, how it was judged, how to load it.

The card's metadata is the Hub's (``base_model``, ``library_name: peft``, ``license``, tags) and parses with
``huggingface_hub.ModelCard``. Facts come from the Store: the feedback snapshot the version was trained on,
its reward model's cross-validated accuracy, the retrain gate's verdict, KL to base, and its arena rating now.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from rlhf.base_models import trained_weights
from rlhf.files import atomic_file
from storage import Policy, Store

# Licenses of the bases the app ships or names (a card needs one; "other" asks the reader to check the base's).
BASE_LICENSES = {"HuggingFaceTB/SmolLM2-135M-Instruct": "apache-2.0"}
LOCAL_PLACEHOLDER = "path/to/this/folder"


@dataclass(frozen=True)
class CardFacts:
    """Everything a card states about one version (None: not known for this version)."""

    agent: str
    version: int
    status: str
    created: str
    base_model: str  # a hub id, or the local base's directory name when it has none
    base_on_hub: bool
    license: str
    system_prompt: str
    parent_version: Optional[int] = None
    trained_here: bool = True
    imported_from: Optional[str] = None
    votes: Optional[int] = None
    ratings: Optional[int] = None
    annotators: Optional[int] = None
    rm_accuracy: Optional[float] = None
    rm_low: Optional[float] = None
    rm_high: Optional[float] = None
    gate_verdict: Optional[str] = None
    gate_win_rate: Optional[float] = None
    gate_low: Optional[float] = None
    gate_high: Optional[float] = None
    gate_reason: Optional[str] = None
    kl_to_base: Optional[float] = None
    voice_stop: Optional[dict] = None  # {step, kept, of, by, passes[, blend]}: the voice watch stopped training, or the check went back
    method: Optional[str] = None  # retrain.method of the run that trained it (None: imported, or not known)
    arena_rating: Optional[float] = None
    arena_low: Optional[float] = None
    arena_high: Optional[float] = None
    arena_votes: int = 0
    lora: dict = field(default_factory=dict)
    base_weights: str = ""  # which weights torch trained on (e.g. a dequantised Q4_1 GGUF), in words
    gate_judged: bool = False  # the gate's win rate and interval came from its held-out judge (else placeholders)
    rm_win_rate: Optional[float] = None  # the reward model's own win rate of this version over the one it replaced


def _number(value) -> Optional[float]:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def learned_from(store: Store, agent: str, snapshot: dict) -> tuple[int, int, int]:
    """(votes, ratings, annotators) in the feedback snapshot a version was trained on, without excluded annotators."""
    rows = store.feedback_rows(agent, until=snapshot)
    excluded = set(rows["excluded_annotators"])
    votes = [c for c in rows["comparisons"] if c["annotator"] not in excluded]
    ratings = [r for r in rows["ratings"] if r["annotator"] not in excluded]
    people = {row["annotator"] or "(anonymous)" for row in votes + ratings}
    return len(votes), len(ratings), len(people)


def arena_row(store: Store, policy: Policy) -> dict:
    """The version's row of its agent's leaderboard now (Bradley–Terry rating on the Elo scale, 95% CI, votes)."""
    from rlhf.analysis.leaderboard import leaderboard

    versions = store.list_policies(policy.agent_id)
    votes = [{"policy_a": c.policy_a_id, "policy_b": c.policy_b_id, "winner": c.winner}
             for c in store.list_comparisons(policy.agent_id)
             if c.policy_a_id is not None and c.policy_b_id is not None and c.policy_a_id != c.policy_b_id]
    if not any(policy.id in (v["policy_a"], v["policy_b"]) for v in votes):
        return {}  # not rated yet (always so at publish time): no need to fit the board
    table = leaderboard(votes, [{"policy_id": p.id, "version": p.version} for p in versions])
    rows = table[table["policy_id"] == policy.id].to_dict(orient="records")
    return rows[0] if rows else {}


def read_adapter_meta(adapter_dir: Path) -> tuple[dict, dict]:
    """(adapter_config.json, version.json) of a version directory (empty dicts when absent)."""
    def load(name: str) -> dict:
        path = Path(adapter_dir) / name
        return json.loads(path.read_text()) if path.is_file() else {}
    return load("adapter_config.json"), load("version.json")


def base_of(adapter_cfg: dict, meta: dict, agent_base: str, data_dir: Path) -> tuple[Optional[str], Optional[str]]:
    """(hub id or None, local path or None) of the base a version's adapter was trained on.

    The local path is the one the app keeps in ``version.json`` (relative to the data dir when under it), else
    the adapter's own ``base_model_name_or_path`` (versions published before bases were named by hub id)."""
    from rlhf.base_models import HUB_ID, hub_id_of

    named = adapter_cfg.get("base_model_name_or_path") or None
    local = meta.get("base_model_path") or named
    local = str(Path(data_dir) / local) if local and not Path(local).is_absolute() and meta.get("base_model_path") \
        else local
    hub = hub_id_of(agent_base, local, data_dir)
    if hub is None and named and HUB_ID.fullmatch(named) and not Path(named).expanduser().exists():
        hub = named
    return hub, local


def card_facts(store: Store, policy: Policy) -> CardFacts:
    """The facts of a published version's card, read from the Store and its directory."""
    if policy.adapter_path is None:
        raise ValueError(f"version {policy.version} is the base model itself: it has no adapter and no card")
    adapter_cfg, meta = read_adapter_meta(Path(policy.adapter_path))
    agent = store.get_agent(policy.agent_id)
    hub, local = base_of(adapter_cfg, meta, agent.base_model, store.root)
    base, on_hub = hub or local or agent.base_model, hub is not None
    m = policy.metrics or {}
    trained = bool(policy.data_snapshot) and not policy.config.get("imported_from")
    votes = ratings = annotators = None
    if trained:
        votes, ratings, annotators = learned_from(store, agent.name, policy.data_snapshot)
    parent = next((p.version for p in store.list_policies(agent.id) if p.id == policy.parent_id), None)
    row = arena_row(store, policy)
    low, high = _number(m.get("gate/low")), _number(m.get("gate/high"))
    judged = m.get("gate/judged")
    if judged is None:  # versions published before the gate said so: a judged interval is never exactly 0–1
        judged = m.get("gate/evidence") == "judge" and (low, high) != (0.0, 1.0)
    rated = int(row.get("wins", 0) + row.get("losses", 0) + row.get("ties", 0))
    return CardFacts(
        agent=agent.name, version=policy.version, status=policy.status, created=policy.created,
        base_model=base if on_hub else Path(str(base)).name, base_on_hub=on_hub,
        license=BASE_LICENSES.get(base, "other") if on_hub else "other", system_prompt=agent.system_prompt,
        parent_version=parent, trained_here=trained, imported_from=policy.config.get("imported_from"),
        votes=votes, ratings=ratings, annotators=annotators,
        rm_accuracy=_number(m.get("reward_model/cv_accuracy")), rm_low=_number(m.get("reward_model/cv_low")),
        rm_high=_number(m.get("reward_model/cv_high")), gate_verdict=m.get("gate/verdict"),
        gate_win_rate=_number(m.get("gate/win_rate")) if judged else None, gate_low=low if judged else None,
        gate_high=high if judged else None, gate_reason=m.get("gate/reason"), gate_judged=bool(judged),
        rm_win_rate=_number(m.get("eval/win_rate")),
        base_weights=trained_weights(agent.base_model),
        method=((policy.config.get("retrain") or {}).get("method") or m.get("retrain/method")) if trained else None,
        kl_to_base=_number(m.get("eval/kl")),
        voice_stop={**{k: m[f"voice_watch/{k}"] for k in ("step", "kept", "of")},
                    "by": m.get("voice_watch/by", "watch"), "passes": m.get("voice_watch/passes"),
                    **({"blend": m["voice_watch/blend"]} if "voice_watch/blend" in m else {})}
        if "voice_watch/step" in m else None,
        arena_rating=_number(row.get("bt")) if rated else None, arena_low=_number(row.get("ci_low")) if rated else None,
        arena_high=_number(row.get("ci_high")) if rated else None, arena_votes=int(row.get("votes", 0)),
        lora={k: adapter_cfg.get(k) for k in ("r", "lora_alpha", "target_modules") if k in adapter_cfg})


def _pct(x: Optional[float]) -> str:
    return "–" if x is None else f"{x:.0%}"


def _interval(value: Optional[float], low: Optional[float], high: Optional[float], fmt: str) -> str:
    if value is None:
        return "not measured"
    text = format(value, fmt)
    return text + (f" (95% interval {format(low, fmt)}–{format(high, fmt)})" if low is not None and high is not None
                   else "")


def _spans_chance(low: Optional[float], high: Optional[float]) -> bool:
    return low is not None and high is not None and low <= 0.5 <= high


def metadata(facts: CardFacts) -> str:
    """The card's YAML metadata block (Hub fields; ``base_model`` only when the base is on the Hub)."""
    from huggingface_hub import ModelCardData

    tags = ["peft", "lora", "rlhf", *([facts.method] if facts.method else []), "rlhf-studio"]
    if facts.base_on_hub:
        tags.append(f"base_model:adapter:{facts.base_model}")
    data = ModelCardData(base_model=facts.base_model if facts.base_on_hub else None, library_name="peft",
                         license=facts.license, pipeline_tag="text-generation", tags=tags)
    return data.to_yaml()


def _learning_lines(f: CardFacts) -> list[str]:
    if not f.trained_here:
        source = f" from `{Path(f.imported_from).name}`" if f.imported_from else ""
        return [f"- Imported{source} into RLHF Studio; it was not trained on the app's feedback."]
    return [f"- Learned from **{f.votes} votes** (pairwise comparisons) and {f.ratings} ratings by "
            f"**{f.annotators} annotator{'s' if f.annotators != 1 else ''}** (annotators excluded from training "
            "not counted).",
            f"- Reward model, cross-validated accuracy: {_interval(f.rm_accuracy, f.rm_low, f.rm_high, '.0%')}"
            + (": too few votes to tell it from chance" if _spans_chance(f.rm_low, f.rm_high) else "") + ".",
            f"- Retrain gate: **{f.gate_verdict or 'not run'}**"
            + (f", the held-out judge's win rate against the version it replaced "
               f"{_interval(f.gate_win_rate, f.gate_low, f.gate_high, '.2f')}" if f.gate_judged
               and f.gate_win_rate is not None else ", without a held-out judge (no interval measured)"
               if f.gate_verdict else "")
            + (f" — {f.gate_reason}" if f.gate_reason else "") + ".",
            *([f"- The reward model it was trained against prefers its replies to the replaced version's on "
               f"{f.rm_win_rate:.0%} of the held-out prompts (that model's own view: no interval)."]
              if f.rm_win_rate is not None else []),
            f"- KL to the base model: {'not measured' if f.kl_to_base is None else f'{f.kl_to_base:.2f} nats per reply'}.",
            *([_voice_sentence(f.voice_stop)] if f.voice_stop else [])]


def _voice_sentence(stop: dict) -> str:
    """What the voice watch (during training) or the voice check (at its end) did to the weights published."""
    if stop.get("by") == "check":
        return (f"- After step {stop['step']} of {stop['of']} its replies to held-out prompts repeated themselves or "
                f"varied less than at the start, so "
                + (f"it kept {stop['blend']:.0%} of the change its training made, the rest of the way back to the "
                   "version it started from (the voice check)." if "blend" in stop
                   else f"it kept the weights after step {stop['kept']} (the voice check)." if stop["kept"] < stop["step"]
                   else "the voice check looked for earlier weights that did not, and found none.")
                + (f" No earlier weights passed in every view the check reads; these weights' {stop['passes']} did."
                   if stop.get("passes") not in (None, "every view", "none")
                   and ("blend" in stop or stop["kept"] < stop["step"]) else ""))
    return (f"- Training stopped at step {stop['step']} of {stop['of']}: its replies had begun to repeat themselves or "
            f"vary less than at the start, so it kept the weights after step {stop['kept']} (the voice watch).")


def _method_words(method: Optional[str]) -> str:
    """The policy method as the card's sentence names it, from the version's own config."""
    from rlhf.training.methods import method_title

    return method_title(method) if method else "a policy update"


SYSTEM_PLACEHOLDER = "YOUR SYSTEM PROMPT"


def _method_text(method: Optional[str]) -> str:
    """The card's sentence on how the version was made: imported, or trained by the method its config names."""
    if method is None:
        return "imported into RLHF Studio."
    return f"trained with RLHF (a reward model from people's votes, then {_method_words(method)}) in RLHF Studio."


def render_card(facts: CardFacts, repo_id: Optional[str] = None, with_system_prompt: bool = False) -> str:
    """The whole README.md: metadata, facts, the ``peft`` snippet (loading from ``repo_id`` or a local folder). The
    agent's system prompt is mentioned, not quoted, unless ``with_system_prompt`` (it may hold private
    instructions)."""
    f = facts
    prompt = json.dumps(f.system_prompt if with_system_prompt else SYSTEM_PLACEHOLDER)
    if not f.system_prompt:
        about_prompt = "It was trained without a system prompt."
    elif with_system_prompt:
        about_prompt = "It was trained to answer with the system prompt above (the agent's)."
    else:
        about_prompt = (f"It was trained to answer under the agent's system prompt ({len(f.system_prompt):,} "
                        "characters, not published with this card): put the one your use needs in its place.")
    source = repo_id or LOCAL_PLACEHOLDER
    base = f.base_model if f.base_on_hub else "path/to/the/base/model"
    arena = ("not rated yet (no arena votes)" if f.arena_rating is None else
             f"{f.arena_rating:.0f} (Bradley–Terry on the Elo scale, 95% interval {f.arena_low:.0f}–{f.arena_high:.0f}"
             f", {f.arena_votes} votes)")
    lora = ", ".join(f"{k} {', '.join(sorted(v)) if isinstance(v, list) else v}" for k, v in f.lora.items()) or "–"
    lines = [
        "---", metadata(f).rstrip("\n"), "---", "",
        f"# {f.agent} v{f.version}", "",
        f"A LoRA adapter for [{f.base_model}]({'https://huggingface.co/' + f.base_model if f.base_on_hub else '#'})"
        f" {_method_text(f.method)}", "",
        f"Trained on {f.base_weights}." if f.base_weights else "", "",
        "| | |", "|---|---|",
        f"| Base model | `{f.base_model}`{'' if f.base_on_hub else ' (a local model: not on the Hugging Face Hub)'} |",
        f"| Version | v{f.version} ({f.status}){'' if f.parent_version is None else f', trained from v{f.parent_version}'} |",
        f"| Date | {f.created[:10]} |",
        f"| Arena rating | {arena} |",
        f"| License | {f.license}{' (as the base model)' if f.license != 'other' else ' (check the base model)'} |",
        f"| Adapter | {lora} |", "",
        "## What it learned from", "", *_learning_lines(f), "",
        "## Use it", "", "```python",
        "from peft import PeftModel",
        "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
        f'base = AutoModelForCausalLM.from_pretrained("{base}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{source}")  # with the chat template the app used',
        f'model = PeftModel.from_pretrained(base, "{source}")', "",
        f"messages = [{{\"role\": \"system\", \"content\": {prompt}}},",
        '            {"role": "user", "content": "Hello!"}]',
        'inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", '
        'return_dict=True)',
        "print(tokenizer.decode(model.generate(**inputs, max_new_tokens=64)[0], skip_special_tokens=True))",
        "```", "",
        about_prompt, "",
        "The folder also holds `adapter_model.gguf`, the same adapter as a GGUF LoRA for llama.cpp "
        "(`--lora adapter_model.gguf` beside a GGUF of the base), when the base's architecture converts.", ""]
    return "\n".join(lines)


def write_card(store: Store, policy: Policy, target_dir: Optional[Path] = None, repo_id: Optional[str] = None,
               with_system_prompt: bool = False) -> Path:
    """Write the version's card as ``README.md`` into its directory (or ``target_dir``), replacing it in one rename."""
    target = Path(target_dir or policy.adapter_path) / "README.md"
    with atomic_file(target) as tmp:
        tmp.write_text(render_card(card_facts(store, policy), repo_id, with_system_prompt))
    return target
