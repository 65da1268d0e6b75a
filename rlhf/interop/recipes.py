"""The ``LAUNCH.md`` of the ``openrlhf`` and ``verl`` exports: cluster commands for pinned engine releases.

Engines rename their command-line flags and config keys between releases (OpenRLHF 0.11 moved every flag
under a dotted group: ``--pretrain`` became ``--actor.model_name_or_path``), so each recipe names the one
release it was checked against. ``tests/rlhf/interop/test_recipes.py`` downloads exactly these releases from
PyPI and checks every flag against the argparse definitions in ``openrlhf/cli/train_rm.py`` and
``train_ppo_ray.py``, every ``key=value`` against verl's shipped Hydra trainer config, every ``trl`` flag
against the installed ``trl reward``, and loads the exported files with the engines' own dataset classes.
Change a version here only together with a run of those tests.

The text lives in Markdown templates beside this module (``templates/*.md``, ``@{name}`` placeholders); the
code decides which sections apply and fills them in. Batch sizes follow the data: a global batch is a power of
two and a multiple of one micro-batch on every GPU (``MICRO`` x ``GPUS``), at most the number of rows, since
both engines drop an incomplete last batch. An export with fewer rows than one such batch gets a ``LAUNCH.md``
that says so instead of a command.
"""
from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

OPENRLHF_VERSION = "0.11.2"
VERL_VERSION = "0.9.1"
TRL_VERSION = "1.16.0"  # the app's pinned TRL: its `trl reward` trains the reward model of the verl recipe

GPUS = 8  # one node; every recipe states this and how to change it
MICRO = 4  # rows per GPU per forward pass
MIN_BATCH = GPUS * MICRO
TEMPLATES = Path(__file__).with_name("templates")  # the recipes' Markdown, one file per section


class _Markdown(string.Template):
    """A recipe template: ``@{name}`` placeholders, since ``$`` belongs to the shell commands inside."""

    delimiter = "@"


def render(name: str, **values) -> str:
    """The template ``templates/NAME.md`` with its ``@{...}`` placeholders filled (a missing value raises)."""
    return _Markdown((TEMPLATES / f"{name}.md").read_text(encoding="utf-8")).substitute(values)


@dataclass
class Lora:
    """The LoRA the app's PPO trains: ``rlhf.base_models.lora_targets`` on the base, ``ppo.lora_r`` / ``ppo.lora_alpha``."""

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


def _values(ctx: Context) -> dict:
    """What every template may name: the export, the cluster's size, the pinned releases, the app's LoRA."""
    return {"out": ctx.out, "base": ctx.base, "converted_base": ctx.converted_base, "gpus": GPUS, "micro": MICRO,
            "agents": ", ".join(ctx.agents), "agent": ctx.agent, "rank": ctx.lora.rank, "alpha": ctx.lora.alpha,
            "targets": _targets_text(ctx.lora, ","), "openrlhf_version": OPENRLHF_VERSION,
            "verl_version": VERL_VERSION, "trl_version": TRL_VERSION}


def _preamble(ctx: Context) -> str:
    text = render("preamble", **_values(ctx))
    if ctx.converted_base is not None:
        text += render("preamble_converted", **_values(ctx))
    return text


# ---- OpenRLHF -----------------------------------------------------------------------------------------------
def openrlhf_launch(ctx: Context, n_pairs: int, n_prompts: int) -> str:
    """Reward model (DeepSpeed) and PPO (Ray + vLLM) with OpenRLHF, then the import back into the app."""
    rm_batch = global_batch(n_pairs, 128)  # DeepSpeed: train_batch_size = micro x GPUs x accumulation
    ppo_rollout = global_batch(n_prompts, 1024)
    values = {**_values(ctx), "n_pairs": n_pairs, "n_prompts": n_prompts, "preamble": _preamble(ctx)}
    head = render("openrlhf_intro", **values)
    rm = _too_little(n_pairs, "preference pairs", DROPS) if rm_batch is None else \
        render("openrlhf_reward_model", **values, rm_batch=rm_batch)
    ppo = "\n## 2. PPO (Ray, vLLM rollouts; all models share the GPUs)\n\n"
    if rm_batch is None:
        ppo += "PPO needs the reward model of step 1.\n\n"
    if ppo_rollout is None:
        ppo += _too_little(n_prompts, "prompts", DROPS)
    if rm_batch is not None and ppo_rollout is not None:
        ppo += render("openrlhf_ppo", **values, ppo_rollout=ppo_rollout, train_batch=min(ppo_rollout, 128),
                      openrlhf_targets=_openrlhf_targets(ctx.lora))
    return head + rm + ppo


def _openrlhf_targets(lora: Lora) -> str:
    # `--ds.lora.target_modules` takes names (nargs="*"); left out, OpenRLHF's default is the string "all-linear".
    return "" if isinstance(lora.targets, str) else " --ds.lora.target_modules " + " ".join(lora.targets)


# ---- verl ---------------------------------------------------------------------------------------------------
def verl_launch(ctx: Context, n_train: int, n_test: int, n_pairs: int) -> str:
    """Reward model (TRL) and PPO with a LoRA actor in verl, the merge to a Hugging Face directory, and the import."""
    rm_ok = n_pairs >= MIN_BATCH
    train_batch = global_batch(n_train, 256)
    values = {**_values(ctx), "n_train": n_train, "n_test": n_test, "n_pairs": n_pairs, "preamble": _preamble(ctx)}
    head = render("verl_intro", **values)
    rm = render("verl_reward_model", **values) if rm_ok else _too_little(
        n_pairs, "preference pairs", "TRL would repeat the few pairs to fill every GPU's batch, and a reward model "
        "from so few says little")
    ppo = "\n## 2. PPO (a LoRA actor: the app's rank, alpha and target modules)\n\n"
    if not rm_ok:
        ppo += "PPO needs the reward model of step 1.\n\n"
    if train_batch is None:
        ppo += _too_little(n_train, "training prompts", DROPS)
    if n_test < 1:
        ppo += "\nverl also needs at least one validation prompt in `test.parquet`; this export has none.\n"
    if not (rm_ok and train_batch is not None and n_test >= 1):
        return head + rm + ppo
    target_value = values["targets"] if isinstance(ctx.lora.targets, str) else f"[{values['targets']}]"
    return head + rm + ppo + render("verl_ppo", **values, train_batch=train_batch, mini=min(train_batch, 64),
                                    target_value=target_value)
