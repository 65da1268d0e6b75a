"""Import a policy trained elsewhere (OpenRLHF, verl, TRL, ...) as a candidate version of an agent.

A PEFT adapter directory is checked against the agent's base (loaded onto it, one forward pass) and
published unchanged (its weights re-saved on their own, see below). A full model directory of the same
architecture is turned into a LoRA adapter: per target matrix, the weight delta ``W_new - W_base`` is
replaced by its best rank-r approximation, a truncated SVD (Eckart–Young: ``U_r S_r V_r^T`` minimises the
Frobenius error among rank-r matrices), split as ``B = U_r sqrt(S_r)``, ``A = sqrt(S_r) V_r^T`` with
``lora_alpha = r`` so the LoRA scale is 1 (Hu et al. 2021, LoRA, eq. 3: ``h = W x + (alpha / r) B A x``).
A model of another architecture cannot become an adapter of this base: the error says to create an agent
on that model instead.

What the cluster engines of ``rlhf.interop.recipes`` write, and how each comes in:

- OpenRLHF ``save_model`` with ``--ds.lora.rank``: ``adapter_config.json`` + ``adapter_model.safetensors``
  (``adapter_model.bin`` instead under ZeRO-3 or tensor parallelism) beside the base's ``config.json`` and the
  tokenizer files: an adapter. Without LoRA it writes a full model directory: a full model.
- verl's model merger (``python -m verl.model_merger merge``): a Hugging Face model directory (a full model);
  after a LoRA run the directory holds the untouched base plus ``lora_adapter/`` (``adapter_config.json`` +
  ``adapter_model.safetensors``), and that subdirectory is the adapter.

An adapter is re-saved from the loaded PEFT model, so the published version holds only the adapter files
(safetensors), whatever else sat beside them.
"""
from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from rlhf.serving.adapter_patterns import check_adapter
from rlhf.config import AppConfig
from rlhf.base_models import load_causal_lm, load_tokenizer, name_local_base, resolve_model
from rlhf.retrain.publish import publish_version
from rlhf.serving.interface import AdapterError
from storage import Policy, Store

log = logging.getLogger(__name__)

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
              "num_key_value_heads", "vocab_size")
PROBE = [{"role": "user", "content": "Say hello in one short sentence."}]


class PolicyImportError(RuntimeError):
    """A directory that cannot become a version of this agent (the message says what to do instead)."""


@dataclass
class ImportResult:
    """The published version and what the import measured."""

    policy: Policy
    kind: str  # adapter | full
    rank: Optional[int] = None
    metrics: dict = field(default_factory=dict)


def find_adapter_dir(path: Path) -> Optional[Path]:
    """``path`` itself when it holds adapter_config.json, or its single named-adapter subdirectory."""
    if (path / "adapter_config.json").is_file():
        return path
    subs = [d for d in path.iterdir() if d.is_dir() and (d / "adapter_config.json").is_file()] if path.is_dir() else []
    return subs[0] if len(subs) == 1 else None


def _probe_logits(model, tokenizer):
    import torch

    from rlhf.prompting import encode_prompt

    ids = torch.tensor([encode_prompt(tokenizer, PROBE)], device=model.device)
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def _check_finite(logits, what: str) -> None:
    import torch

    if not torch.isfinite(logits).all():
        raise PolicyImportError(f"{what} produces non-finite logits on a probe prompt; refusing to import it")


def architecture_mismatch(base_cfg: dict, new_cfg: dict) -> list[str]:
    """Config fields (architecture and shapes) in which two models differ."""
    return [f"{k}: {base_cfg.get(k)!r} vs {new_cfg.get(k)!r}" for k in SHAPE_KEYS if base_cfg.get(k) != new_cfg.get(k)]


def low_rank_factors(delta, rank: int):
    """(B, A, residual Frobenius norm) with ``B @ A`` the best rank-``rank`` approximation of ``delta``."""
    import torch

    U, S, Vh = torch.linalg.svd(delta.float(), full_matrices=False)
    r = min(rank, S.numel())
    root = S[:r].sqrt()
    B = U[:, :r] * root  # (out, r)
    A = root[:, None] * Vh[:r]  # (r, in)
    # The discarded singular values are exactly the residual: ||delta - B A||_F^2 = sum_{i > r} S_i^2.
    residual = S[r:].pow(2).sum().sqrt().item()
    if r < rank:  # a matrix smaller than the rank: pad with zeros so every module has the same rank
        B = torch.cat([B, B.new_zeros(B.shape[0], rank - r)], dim=1)
        A = torch.cat([A, A.new_zeros(rank - r, A.shape[1])], dim=0)
    return B, A, residual


def linear_module_names(model) -> tuple[str, ...]:
    """Short names of every ``nn.Linear`` but the output head: what PEFT's ``target_modules="all-linear"`` picks
    (GPT-2 style ``Conv1D`` layers store the weight transposed and are left out)."""
    import torch

    head = model.get_output_embeddings()
    names = {name.rsplit(".", 1)[-1] for name, m in model.named_modules()
             if isinstance(m, torch.nn.Linear) and m is not head}
    return tuple(sorted(names))


def adapter_from_full_model(base, new, rank: int, targets: tuple[str, ...], out_dir: Path) -> dict:
    """Write a LoRA adapter of ``base`` approximating ``new`` to ``out_dir``; returns error figures.

    ``targets`` are module names, or ``("all-linear",)`` for every linear layer but the output head (the
    recipes' spelling when the app's LoRA covers all linear layers)."""
    import torch
    from peft import LoraConfig, get_peft_model

    if tuple(targets) == ("all-linear",):
        targets = linear_module_names(base)

    base_state = {k: v for k, v in base.state_dict().items()}
    new_state = new.state_dict()
    total_sq, residual_sq, untracked_sq, untracked_base_sq, worst = 0.0, 0.0, 0.0, 0.0, 0.0
    factors = {}
    for name, w_base in base_state.items():
        if name not in new_state or new_state[name].shape != w_base.shape:
            raise PolicyImportError(f"weight {name} is missing or has another shape in the imported model")
        delta = new_state[name].float() - w_base.float()
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in targets and delta.dim() == 2:
            B, A, residual = low_rank_factors(delta, rank)
            norm = delta.norm().item()
            factors[module] = (B, A)
            total_sq += norm ** 2
            residual_sq += residual ** 2
            worst = max(worst, residual / norm if norm > 0 else 0.0)
        else:
            untracked_sq += delta.pow(2).sum().item()
            untracked_base_sq += w_base.float().pow(2).sum().item()
    if not factors:
        raise PolicyImportError(f"no target modules ({', '.join(targets)}) found in the model")
    cfg = LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                     target_modules=sorted({m.rsplit(".", 1)[-1] for m in factors}))
    peft_model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, module in peft_model.named_modules():
            key = name.removeprefix("base_model.model.")
            if key in factors and hasattr(module, "lora_A"):
                B, A = factors[key]
                module.lora_A["default"].weight.copy_(A.to(module.lora_A["default"].weight.dtype))
                module.lora_B["default"].weight.copy_(B.to(module.lora_B["default"].weight.dtype))
    peft_model.save_pretrained(str(out_dir))
    return {"peft_model": peft_model,
            "import/reconstruction_error": math.sqrt(residual_sq / total_sq) if total_sq > 0 else 0.0,
            "import/worst_matrix_error": worst,
            # Changes outside the target matrices (norms, embeddings) cannot ride in a LoRA adapter.
            "import/untracked_change": math.sqrt(untracked_sq / untracked_base_sq) if untracked_base_sq > 0 else 0.0}


def adapter_settings(adapter_dir: Path) -> dict:
    """Rank, alpha and target modules from an adapter's ``adapter_config.json`` (refusing a zero alpha)."""
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    if cfg.get("peft_type", "LORA") == "LORA" and not cfg.get("lora_alpha"):
        raise PolicyImportError(
            f"{adapter_dir / 'adapter_config.json'} has lora_alpha {cfg.get('lora_alpha')!r}, which scales the "
            "adapter to nothing. verl's model merger writes 0 when the checkpoint lacks lora_train_meta.json: set "
            "lora_alpha to the value the run trained with (actor_rollout_ref.model.lora_alpha) and import again.")
    targets = cfg.get("target_modules")
    return {"rank": cfg.get("r"), "lora_alpha": cfg.get("lora_alpha"),
            "targets": sorted(targets) if isinstance(targets, list) else targets}


def _import_adapter(store: Store, config: AppConfig, agent_rec, parent, path: Path, adapter_dir: Path, base,
                    tokenizer, promote: bool) -> ImportResult:
    from peft import PeftModel

    settings = adapter_settings(adapter_dir)
    try:
        check_adapter(adapter_dir)  # its module patterns, before PEFT runs them
    except AdapterError as exc:
        raise PolicyImportError(f"the adapter in {adapter_dir} cannot be imported: {exc}") from exc
    try:
        model = PeftModel.from_pretrained(base, str(adapter_dir))
    except Exception as exc:  # shape mismatches and unknown modules surface as many error types
        raise PolicyImportError(f"the adapter in {adapter_dir} does not fit the base model of agent "
                                f"{agent_rec.name!r} ({agent_rec.base_model}): {type(exc).__name__}: {exc}") from exc
    name_local_base(model, base)  # re-saved below (offline); publishing names the base by hub id again
    model.eval()
    _check_finite(_probe_logits(model, tokenizer), "the adapter")
    if (settings["rank"], settings["lora_alpha"]) != (config.ppo.lora_r, config.ppo.lora_alpha):
        log.warning("imported adapter has rank %s / alpha %s; the app trains rank %s / alpha %s (ppo.lora_r, "
                    "ppo.lora_alpha): it serves as is, but later in-app training continues from it with its own "
                    "shape", settings["rank"], settings["lora_alpha"], config.ppo.lora_r, config.ppo.lora_alpha)
    tmp = Path(tempfile.mkdtemp(prefix="rlhf-import-"))
    try:
        model.save_pretrained(str(tmp))  # only the adapter, as safetensors (an OpenRLHF ZeRO-3 save is .bin)
        policy = publish_version(store, config, agent_rec.name, tmp, parent_id=parent.id, promote=promote,
                                 run_config={"imported_from": str(path), "adapter_dir": str(adapter_dir),
                                             "kind": "adapter", "targets": settings["targets"]},
                                 metrics={"import/rank": settings["rank"],
                                          "import/lora_alpha": settings["lora_alpha"]})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ImportResult(policy, "adapter", settings["rank"], {"import/rank": settings["rank"],
                                                              "import/lora_alpha": settings["lora_alpha"]})


def import_policy(store: Store, config: AppConfig, path: str | Path, agent: str, rank: int = 16,
                  targets: tuple[str, ...] = DEFAULT_TARGETS, promote: bool = False) -> ImportResult:
    """Publish an adapter or a full model directory as a new (candidate) version of ``agent``."""
    path = Path(path).expanduser().resolve()
    if not path.is_dir():
        raise PolicyImportError(f"{path} is not a directory (expected a PEFT adapter or a model directory)")
    if rank < 1:
        raise PolicyImportError("--rank must be at least 1")
    agent_rec = store.get_agent(agent)
    parent = store.active_policy(agent_rec.id)
    source = resolve_model(agent_rec.base_model, config.data_path)
    tokenizer = load_tokenizer(source)
    base = load_causal_lm(source, "cpu")
    adapter_dir = find_adapter_dir(path)
    if adapter_dir is not None:
        return _import_adapter(store, config, agent_rec, parent, path, adapter_dir, base, tokenizer, promote)
    if not (path / "config.json").is_file():
        raise PolicyImportError(f"{path} holds neither adapter_config.json (a PEFT adapter) nor config.json "
                                "(a full model)")
    new_cfg = json.loads((path / "config.json").read_text())
    problems = architecture_mismatch(base.config.to_dict(), new_cfg)
    if problems:
        raise PolicyImportError(
            f"{path} is not the same architecture as agent {agent!r}'s base model {agent_rec.base_model} "
            f"({'; '.join(problems)}), so it cannot become one of its versions. Create an agent with that model "
            f"as its base instead: POST /api/v1/agents {{\"name\": ..., \"base_model\": \"{path}\"}} or the Data "
            "tab's Agents panel.")
    new = load_causal_lm(str(path), "cpu")
    probe_full = _probe_logits(new, tokenizer)
    _check_finite(probe_full, "the imported model")
    tmp = Path(tempfile.mkdtemp(prefix="rlhf-import-"))
    try:
        figures = adapter_from_full_model(base, new, rank, targets, tmp)
        peft_model = figures.pop("peft_model")
        peft_model.eval()
        probe_lora = _probe_logits(peft_model, tokenizer)
        figures["import/probe_logit_max_abs_diff"] = (probe_lora - probe_full).abs().max().item()
        log.info("imported %s as a rank-%d LoRA: %s", path, rank, figures)
        policy = publish_version(store, config, agent_rec.name, tmp, parent_id=parent.id, promote=promote,
                                 run_config={"imported_from": str(path), "kind": "full", "rank": rank,
                                             "targets": list(targets)},
                                 metrics={**figures, "import/rank": rank})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ImportResult(policy, "full", rank, figures)
