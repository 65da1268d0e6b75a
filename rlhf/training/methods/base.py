"""What a retrain method is (``retrain.method``, registered in ``rlhf.training.methods``): one object per method
that the retrain asks for everything method-specific, so the retrain itself never names a method."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence


class PolicyMethod:
    """One way the retrain's policy learns the votes. Subclasses set the class fields and implement the three
    methods; none imports torch at module level (the registry imports them for the config check and the UI)."""

    name: str = ""  # the retrain.method value, the job phase's name and the version's metrics' retrain/method
    title: str = ""  # how the job log, the model card and the dashboard describe it
    section: str = ""  # its AppConfig section ("ppo", "dpo", ...)
    rate_key: str = ""  # seconds per unit of work, measured by a finished retrain for the next estimate
    default_rate: float = 1.0  # that rate on a 2-core CPU with SmolLM2-135M, until this machine measured its own

    def settings(self, config):
        """This method's config section."""
        return getattr(config, self.section)

    def units(self, config, pairs: int, steps: Optional[int] = None) -> float:
        """Units of work (``rate_key``'s denominator) of a run on ``pairs`` pairs (``steps``: what it ran)."""
        raise NotImplementedError

    def total_steps(self, config, pairs: int) -> int:
        """Optimizer steps of a run on ``pairs`` pairs (the progress bar's denominator)."""
        raise NotImplementedError

    def train(self, config, base_source: str, reward_fn, pairs: Sequence[dict], prompts,
              eval_prompts: Sequence[list[dict]], run_dir: Path, init_adapter: Optional[str] = None,
              resume: Optional[Path] = None, on_step: Optional[Callable[[int, dict], None]] = None,
              device: str = "cpu", base=None, evaluate_before: bool = True):
        """Train a LoRA adapter on the base from ``init_adapter``; the result has ``final_dir``, ``kl``, ``steps``,
        ``reward_before``/``reward_after``, ``phase_seconds``, ``history``, ``run_dir`` and ``policy``."""
        raise NotImplementedError

    def result_metrics(self, trained, pairs: int) -> dict:
        """The version's metrics this method adds (namespaced by its section)."""
        return {}
