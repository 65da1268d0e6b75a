"""The openrlhf / verl exports' LAUNCH.md checked against the pinned engine releases' own code (issue 18).

The wheels of ``openrlhf`` and ``verl`` at the versions in ``rlhf.interop.recipes`` are downloaded once from
the package index into ``.cache/engines/`` (no install, no GPU): every flag of the OpenRLHF commands must be
defined by the release's ``train_rm.py`` / ``train_ppo_ray.py`` argparse code (and its values pass that
parser), every ``key=value`` of the verl command must exist in the release's composed Hydra trainer config,
every ``trl`` flag must be accepted by the installed ``trl reward``, and the exported files are read with the
engines' own dataset classes and the SmolLM2 tokenizer (saved beside the tiny test model, which stands in for
the base). Without the package index these tests skip, saying so.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from rlhf.config import load_config
from rlhf.interop import recipes
from rlhf.interop.export import export
from storage import Store
from tests.rlhf.interop.engines import (ParseError, command_after, commands, compose, defined_flags, engine_import,
                                        fetch, hydra_value, inline_flags, keys, lookup, omegaconf_stub, parse_strict,
                                        parser_from_source, resolve_selects, substitute)

N_CONVERSATIONS = 48  # enough for one global batch (micro-batch 4 x 8 GPUs) in every recipe step
APP_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]  # rlhf.base_models.lora_targets on the tiny Llama


def fill(store: Store, n: int) -> None:
    """``n`` conversations, each with a good and a bad sibling reply, scores, thumbs and a vote."""
    policy = store.active_policy("assistant").id
    for i in range(n):
        conv = store.create_conversation("assistant", "alice", messages=[{"role": "user", "content": f"question {i}"}])
        user = store.leaf(conv.id)
        good = store.record_reply(user.id, f"a careful answer {i}", policy)
        bad = store.record_reply(user.id, f"nonsense {i}", policy)
        store.record_rating(good.id, "alice", thumb=1, score=5)
        store.record_rating(bad.id, "alice", thumb=-1, score=1)
        store.record_comparison(good.id, bad.id, "a", "bob")


def make_exports(root: Path, base: str, n: int) -> dict:
    config = load_config(env={}, overrides=[f"data_dir={root / 'data'}"])
    store = Store(config.db_path)
    try:
        store.ensure_default_agent(base)
        fill(store, n)
        return {fmt: export(store, config, fmt, root / fmt, agent="assistant") for fmt in ("openrlhf", "verl")} | {
            "config": config}
    finally:
        store.close()


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_model_dir):
    return make_exports(tmp_path_factory.mktemp("exports"), str(tiny_model_dir), N_CONVERSATIONS)


@pytest.fixture(scope="module")
def openrlhf_src():
    return fetch("openrlhf", recipes.OPENRLHF_VERSION)


@pytest.fixture(scope="module")
def verl_src():
    return fetch("verl", recipes.VERL_VERSION)


def launch(result) -> str:
    return (result.path / "LAUNCH.md").read_text()


def env_for(result, tmp_path, base) -> dict:
    return {"EXPORT_DIR": str(result.path), "CKPT_DIR": str(tmp_path / "ckpt"), "BASE_MODEL": str(base)}


def flags(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith("--")]


def test_recipes_name_the_verified_versions(exported):
    text = launch(exported["openrlhf"])
    assert f"OpenRLHF {recipes.OPENRLHF_VERSION}" in text and f"openrlhf[vllm]=={recipes.OPENRLHF_VERSION}" in text
    text = launch(exported["verl"])
    assert f"verl {recipes.VERL_VERSION}" in text and f"TRL {recipes.TRL_VERSION}" in text
    import trl

    assert trl.__version__ == recipes.TRL_VERSION, "the installed trl is not the one the verl recipe names"
    manual = (Path(__file__).resolve().parents[3] / "docs" / "exports.md").read_text()
    section = manual.split("## Exports and bigger engines", 1)[1].split("\n## ", 1)[0]
    for name, version in (("OpenRLHF", recipes.OPENRLHF_VERSION), ("verl", recipes.VERL_VERSION),
                          ("TRL", recipes.TRL_VERSION)):
        assert f"{name} {version}" in section, f"docs/exports.md does not name {name} {version}"


# ---- OpenRLHF -------------------------------------------------------------------------------------------------
def test_openrlhf_flags_are_defined_by_its_cli(exported, openrlhf_src):
    cli = openrlhf_src / "openrlhf" / "cli"
    text = launch(exported["openrlhf"])
    cmds = commands(text)
    checked = {}
    for module, source in (("openrlhf.cli.train_rm", "train_rm.py"),
                           ("openrlhf.cli.train_ppo_ray", "train_ppo_ray.py")):
        parser = parser_from_source(cli / source)
        argv = command_after(cmds, module)
        unknown = sorted(set(flags(argv)) - defined_flags(parser))
        assert not unknown, f"{source} of OpenRLHF {recipes.OPENRLHF_VERSION} does not define {unknown}"
        checked[source] = (parse_strict(parser, argv), len(set(flags(argv))))
    rm, n_rm = checked["train_rm.py"]
    ppo, n_ppo = checked["train_ppo_ray.py"]
    assert n_rm >= 15 and n_ppo >= 30  # every step of both commands is covered, not a sample
    # The flags named in the text (margin loss, normalisation, the LoRA switch for a later release) exist too.
    mentioned = inline_flags(text, ("--ds.", "--actor.", "--data.", "--model.", "--reward.", "--train."))
    defined = set().union(*(defined_flags(parser_from_source(cli / f)) for f in ("train_rm.py", "train_ppo_ray.py")))
    assert {"--ds.lora.rank", "--ds.lora.target_modules"} <= mentioned and not mentioned - defined

    rows = len(exported["openrlhf"].path.joinpath("rm_pairs.jsonl").read_text().splitlines())
    prompts = len(exported["openrlhf"].path.joinpath("prompts.jsonl").read_text().splitlines())
    g = vars(rm)
    # What train_rm / DeepSpeed need: a global batch of whole micro-batches on every GPU, no larger than the data.
    assert g["train.batch_size"] % (g["train.micro_batch_size"] * recipes.GPUS) == 0 and g["train.batch_size"] <= rows
    assert g["model.margin_loss_enable"] and g["data.apply_chat_template"] and g["data.prompt_key"] == "prompt"
    p = vars(ppo)
    # train_ppo_ray.py: "actor_num_nodes * actor_num_gpus_per_node must be equal to vllm_num_engines *
    # vllm_tensor_parallel_size" under --train.colocate_all, and "The number of sample batches must be greater
    # than or equal to the effective number of actor processes."
    actor_gpus = p["actor.num_nodes"] * p["actor.num_gpus_per_node"]
    assert p["train.colocate_all"] and actor_gpus == p["vllm.num_engines"] * p["vllm.tensor_parallel_size"]
    assert p["rollout.batch_size"] // p["rollout.micro_batch_size"] >= actor_gpus
    assert p["train.batch_size"] % (p["train.micro_batch_size"] * actor_gpus) == 0
    # prepare_datasets: max_steps = len(prompts) * n_samples_per_prompt // train.batch_size * episodes * epochs.
    assert prompts // p["train.batch_size"] >= 1 and p["rollout.batch_size"] <= prompts
    assert p["data.input_key"] == "context_messages" and p["data.apply_chat_template"]
    assert {p[f"{m}.num_gpus_per_node"] for m in ("ref", "critic", "reward")} == {actor_gpus}


def test_openrlhf_parser_rebuild_catches_the_old_flags(openrlhf_src):
    """The check has teeth: the flat flags of the previous recipe are refused by 0.11.2's parser."""
    parser = parser_from_source(openrlhf_src / "openrlhf" / "cli" / "train_ppo_ray.py")
    for old in (["--pretrain", "x"], ["--lora_rank", "16"], ["--zero_stage", "2"], ["--actor.model_name_or"]):
        with pytest.raises(ParseError):
            parse_strict(parser, old)
    with pytest.raises(ParseError, match="invalid choice"):
        parse_strict(parser, ["--ds.param_dtype", "fp32"])


def test_openrlhf_reads_the_export_with_its_own_datasets(exported, openrlhf_src, tiny_model_dir, tmp_path):
    result = exported["openrlhf"]
    cli = openrlhf_src / "openrlhf" / "cli"
    cmds = commands(launch(result))
    env = env_for(result, tmp_path, tiny_model_dir)  # its directory holds SmolLM2's tokenizer
    rm_argv = substitute(command_after(cmds, "openrlhf.cli.train_rm"), env)
    ppo_argv = substitute(command_after(cmds, "openrlhf.cli.train_ppo_ray"), env)
    pairs = [json.loads(line) for line in (result.path / "rm_pairs.jsonl").read_text().splitlines()]
    # openrlhf/utils/__init__.py imports its math grader (sympy, pylatexenc): skipped, the modules below do not need it.
    with engine_import(openrlhf_src, {"openrlhf": "openrlhf", "openrlhf.utils": "openrlhf/utils"}):
        from openrlhf.datasets import PromptDataset, RewardDataset
        from openrlhf.datasets.utils import blending_datasets
        from openrlhf.utils.config import hierarchize
        from openrlhf.utils.utils import get_tokenizer

        # train_rm.py's own steps: parse, hierarchize, get_tokenizer, blending_datasets, RewardDataset.
        args = hierarchize(parse_strict(parser_from_source(cli / "train_rm.py"), rm_argv))
        strategy = SimpleNamespace(args=args, is_rank_0=lambda: True, print=lambda *a: None)
        tok = get_tokenizer(args.model.model_name_or_path, None, "left", strategy,
                            use_fast=not args.data.disable_fast_tokenizer)
        data = blending_datasets(args.data.dataset, args.data.dataset_probs, strategy, args.train.seed,
                                 max_count=args.data.max_samples, dataset_split=args.data.dataset_split)
        # num_processors=1 instead of its default 8 worker processes: the same code path, lighter here.
        ds = RewardDataset(data, tok, args.data.max_len, strategy, input_template=args.data.input_template,
                           num_processors=1)
        assert len(ds) == len(pairs)
        chosen_ids, chosen_mask, reject_ids, reject_mask, margin = ds[0]
        chosen = tok.decode(chosen_ids[0])
        assert "question 0" in chosen and "a careful answer 0" in chosen and chosen.endswith(tok.eos_token)
        assert "nonsense 0" in tok.decode(reject_ids[0]) and margin == pairs[0]["margin"] > 0
        assert chosen.count("<|im_start|>assistant") == 1  # the prompt's template and the reply joined once
        batch = ds.collate_fn([ds[i] for i in range(4)])
        assert batch[0].shape[0] == 4 and batch[0].shape == batch[1].shape
        assert batch[4] == [p["margin"] for p in pairs[:4]]

        # train_ppo_ray.py -> ppo_trainer.prepare_datasets: blending_datasets + PromptDataset.
        args = hierarchize(parse_strict(parser_from_source(cli / "train_ppo_ray.py"), ppo_argv))
        strategy = SimpleNamespace(args=args, is_rank_0=lambda: True, print=lambda *a: None)
        data = blending_datasets(args.data.prompt_dataset, args.data.prompt_probs, strategy, args.train.seed,
                                 max_count=args.data.max_samples, dataset_split=args.data.prompt_split)
        prompts = PromptDataset(data, tok, strategy, input_template=args.data.input_template)
        assert len(prompts) == len(data) >= N_CONVERSATIONS
        datasource, prompt, label, image = prompts[0]
        assert prompt.startswith("<|im_start|>system") and prompt.endswith("<|im_start|>assistant\n")
        assert "question" in prompt and label == "" and image is None


# ---- verl -----------------------------------------------------------------------------------------------------
def verl_overrides(text: str) -> dict[str, str]:
    argv = command_after(commands(text), "verl.trainer.main_ppo")
    assert all("=" in a and not a.startswith(("+", "~")) for a in argv), "only plain key=value overrides"
    return dict(a.split("=", 1) for a in argv)


def test_verl_keys_exist_in_its_trainer_config(exported, verl_src):
    config_dir = verl_src / "verl" / "trainer" / "config"
    tree = compose(config_dir, "ppo_trainer")
    # The composer is checked against the composed config verl ships for documentation (same keys).
    generated = keys(yaml.safe_load((config_dir / "_generated_ppo_trainer.yaml").read_text()))
    assert keys(tree) - generated <= {"model_engine"} and not generated - keys(tree)
    overrides = verl_overrides(launch(exported["verl"]))
    missing = sorted(k for k in overrides if k not in keys(tree))
    assert not missing, f"verl {recipes.VERL_VERSION}'s trainer config has no {missing}"
    # Each override sets a value, not a whole section.
    assert not [k for k in overrides if isinstance(lookup(tree, k), dict)]
    assert len(overrides) >= 30
    o = {k: hydra_value(v) for k, v in overrides.items()}
    assert o["trainer.save_freq"] > 0  # verl checkpoints only when save_freq > 0 (trainer_base.py)
    assert o["actor_rollout_ref.actor.ppo_mini_batch_size"] <= o["data.train_batch_size"]
    per_gpu = o["actor_rollout_ref.actor.ppo_mini_batch_size"] // o["trainer.n_gpus_per_node"]
    assert per_gpu % o["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 0 and per_gpu > 0
    # The merge command's flags are defined by verl's model merger.
    merger = parser_from_source(verl_src / "verl" / "model_merger" / "base_model_merger.py",
                                ("base_op_parser", "merge_parser"))
    argv = command_after(commands(launch(exported["verl"])), "verl.model_merger")
    assert argv[0] == "merge"
    assert parse_strict(merger, argv[1:]).backend == "fsdp"


def test_verl_reads_train_parquet_with_its_rl_dataset(exported, verl_src, tiny_model_dir, tmp_path):
    result = exported["verl"]
    tree = compose(verl_src / "verl" / "trainer" / "config", "ppo_trainer")
    env = env_for(result, tmp_path, tiny_model_dir)  # its directory holds SmolLM2's tokenizer
    for key, value in verl_overrides(launch(result)).items():
        *parents, leaf = key.split(".")
        lookup(tree, ".".join(parents))[leaf] = hydra_value(substitute([value], env)[0])
    packages = {"verl": "verl", "verl.utils": "verl/utils", "verl.utils.dataset": "verl/utils/dataset"}
    with engine_import(verl_src, packages, {"omegaconf": omegaconf_stub()}):
        from omegaconf import DictConfig
        from verl.utils.dataset.rl_dataset import collate_fn, get_dataset_class
        from verl.utils.tokenizer import hf_tokenizer

        data_cfg = DictConfig(resolve_selects(tree["data"], tree))
        tok = hf_tokenizer(str(tiny_model_dir))  # SmolLM2's tokenizer, saved with the tiny model
        # verl/trainer/ppo/utils.py create_rl_dataset: get_dataset_class(data_config)(data_files=..., ...).
        dataset_cls = get_dataset_class(data_cfg)
        ds = dataset_cls(data_files=data_cfg["train_files"], tokenizer=tok, processor=None, config=data_cfg,
                         max_samples=data_cfg["train_max_samples"])
        train = exported["verl"].counts["train"]
        assert len(ds) == train >= recipes.MIN_BATCH  # none filtered as too long, enough for the batch
        row = ds[0]
        assert row["raw_prompt"][-1]["role"] == "user" and row["raw_prompt"][0]["role"] == "system"
        assert row["data_source"] == "rlhf-studio/assistant" and row["reward_model"]["style"] == "model"
        assert row["index"] == 0 and row["extra_info"]["split"] == "train"
        batch = collate_fn([ds[0], ds[1]])
        assert batch["dummy_tensor"].shape == (2, 1) and len(batch["raw_prompt"]) == 2
        val = dataset_cls(data_files=data_cfg["val_files"], tokenizer=tok, processor=None, config=data_cfg)
        assert len(val) == exported["verl"].counts["test"] >= 1


# ---- TRL (the verl recipe's reward model) ---------------------------------------------------------------------
def test_trl_reward_flags_are_accepted_by_the_installed_trl(exported, tiny_model_dir, tmp_path):
    from trl.cli.accelerate_launcher import launch_training_script
    from trl.cli.commands.training import _subtract_subsequence
    from trl.scripts.reward import main, make_parser

    help_text = subprocess.run([str(Path(sys.executable).parent / "trl"), "reward", "--help"], capture_output=True,
                               text=True, timeout=300, check=True).stdout
    accepted = set(re.findall(r"(?<![\w-])(--[A-Za-z][\w.-]*)", help_text))
    argv = command_after(commands(launch(exported["verl"])), "trl")
    assert argv[0] == "reward"
    argv = substitute(argv[1:], {"EXPORT_DIR": str(exported["verl"].path), "CKPT_DIR": str(tmp_path),
                                 "BASE_MODEL": str(tiny_model_dir)})
    # TRL's own routing (trl/cli/commands/training.py): flags its script parser does not know go to `accelerate launch`.
    # (`--use_cpu true` only lets RewardConfig accept `--bf16 true` on this GPU-less machine while parsing.)
    *_, config_rest, launch_args = make_parser(prog="trl reward").parse_args_and_config(
        argv + ["--use_cpu", "true"], return_remaining_strings=True, separate_remaining_strings=True)
    script_args = _subtract_subsequence(argv, launch_args)
    assert not set(flags(script_args)) - accepted, "flags not in `trl reward --help`"
    assert flags(launch_args) == ["--num_processes"] and not config_rest
    launched = []  # accelerate's own launch parser must take them (the launch itself is not run)
    launch_training_script("reward.py", launch_args, script_args, launch_command_fn=launched.append)
    assert launched[0].num_processes == recipes.GPUS
    # The recipe's arguments, shrunk to one CPU step on the tiny model: TRL's reward script loads the export's
    # rm/ directory itself (load_dataset(--dataset_name)) and trains on it.
    small = ["--max_steps", "1", "--use_cpu", "true", "--bf16", "false", "--report_to", "none",
             "--save_strategy", "no", "--logging_steps", "1", "--per_device_train_batch_size", "2"]
    script, training, model_args, dataset_args = make_parser().parse_args_and_config(script_args + small)
    assert script.dataset_name == str(exported["verl"].path / "rm")
    assert model_args.model_name_or_path == str(tiny_model_dir)
    main(script, training, model_args, dataset_args)
    assert (tmp_path / "rlhf-studio-rm" / "config.json").is_file()


# ---- the app's side -------------------------------------------------------------------------------------------
def test_import_commands_parse_with_our_cli(exported):
    import argparse

    from cli.interop import add_import_args

    parser = argparse.ArgumentParser(exit_on_error=False)
    add_import_args(parser)
    for fmt in ("openrlhf", "verl"):
        argv = command_after(commands(launch(exported[fmt])), "import-policy")
        args = parser.parse_args(argv)
        assert args.agent == "assistant"


def test_policy_lora_matches_the_app(exported, tiny_model_dir):
    """The recipes train (verl) or import (OpenRLHF) the LoRA the app's PPO trains: ppo.lora_r / lora_alpha on
    rlhf.base_models.lora_targets of the base."""
    from transformers import AutoModelForCausalLM

    from rlhf.base_models import lora_targets

    config = exported["config"]
    targets = lora_targets(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    assert targets == APP_TARGETS
    o = {k: hydra_value(v) for k, v in verl_overrides(launch(exported["verl"])).items()}
    assert o["actor_rollout_ref.model.lora_rank"] == config.ppo.lora_r
    assert o["actor_rollout_ref.model.lora_alpha"] == config.ppo.lora_alpha
    assert o["actor_rollout_ref.model.target_modules"] == targets
    text = launch(exported["openrlhf"])
    argv = command_after(commands(text), "import-policy")
    assert argv[argv.index("--rank") + 1] == str(config.ppo.lora_r)
    assert argv[argv.index("--targets") + 1].split(",") == targets
    lora_flags = f"--ds.lora.rank {config.ppo.lora_r} --ds.lora.alpha {config.ppo.lora_alpha} " \
                 f"--ds.lora.target_modules {' '.join(targets)}"
    assert lora_flags in text


def test_too_little_data_says_so_instead_of_a_recipe(tmp_path, tiny_model_dir):
    small = make_exports(tmp_path, str(tiny_model_dir), 4)
    text = launch(small["openrlhf"])
    assert text.count("Too little data") == 2 and "4 preference pairs" in text
    assert not [c for c in commands(text) if "openrlhf.cli.train_rm" in c or "openrlhf.cli.train_ppo_ray" in c]
    assert "import-policy" not in text.split("## 2.", 1)[1]
    text = launch(small["verl"])
    assert "Too little data" in text
    assert not [c for c in commands(text) if "verl.trainer.main_ppo" in c or "trl" in c]


def test_batch_sizes_follow_the_data():
    assert recipes.global_batch(31, 128) is None
    assert recipes.global_batch(32, 128) == 32
    assert recipes.global_batch(100, 128) == 64
    assert recipes.global_batch(5000, 128) == 128
    assert recipes.global_batch(700, 1024) == 512


def test_all_linear_lora_is_spelled_for_each_engine(tmp_path):
    """A base without attention projections gets the app's "all-linear" LoRA in every engine's own spelling."""
    ctx = recipes.Context(tmp_path, "some/model", ["a"], recipes.Lora(8, 16, "all-linear"))
    verl = recipes.verl_launch(ctx, 64, 2, 64)
    assert verl_overrides(verl)["actor_rollout_ref.model.target_modules"] == "all-linear"
    openrlhf = recipes.openrlhf_launch(ctx, 64, 64)
    assert "--ds.lora.rank 8 --ds.lora.alpha 16`" in openrlhf  # OpenRLHF's default target is "all-linear"
    argv = command_after(commands(openrlhf), "import-policy")
    assert argv[argv.index("--targets") + 1] == "all-linear"


def test_recipe_templates_are_filled_and_shipped_with_the_package():
    """Every ``@{name}`` of every template gets a value (the shell's ``$VARS`` stay as they are), and the templates
    are package data: an installed app writes the same LAUNCH.md."""
    ctx = recipes.Context(Path("/exp"), "hub/base", ["a"], recipes.Lora(8, 16, ["q_proj", "v_proj"]), Path("/conv"))
    text = recipes.openrlhf_launch(ctx, 500, 5000) + recipes.verl_launch(ctx, 500, 10, 500)
    assert "@{" not in text and "$EXPORT_DIR" in text and "$(cat $CKPT_DIR" in text and "{style: model}" in text
    root = Path(__file__).resolve().parents[3]
    assert '"rlhf.interop" = ["templates/*.md"]' in (root / "pyproject.toml").read_text()
    assert sorted(p.stem for p in recipes.TEMPLATES.glob("*.md")) == sorted(
        ["preamble", "preamble_converted", "openrlhf_intro", "openrlhf_reward_model", "openrlhf_ppo", "verl_intro",
         "verl_reward_model", "verl_ppo"])
