"""The voice watch: a PPO run stops once its own rollouts start to loop or lose their variety, and keeps the last
weights whose rollouts still sounded like the policy it started from.

A reward model fitted on a few votes can pay for a surface feature (numbers, list markers) that the policy learns
to repeat; the guard then rejects the new version after the whole run was spent. The rollouts already show the drift
while it happens: each step logs ``voice/repetition`` (the mean share of a reply's word 3-grams that repeat, the
guard's measure) and ``voice/distinct2`` over the step's replies. The first step's rollouts come from the starting
weights, so they are the reference. After each step the mean over the last ``ppo.stop_window`` steps is compared
with it; a rise in repetition above ``ppo.stop_repetition_rise`` or a fall in distinct-2 below
``ppo.stop_distinct_drop`` stops the run. Step k's rollouts were sampled from the weights after step k-1, so each
check that passes vouches for those weights; on a stop the policy goes back to the last weights vouched for.

The decision reads the step metrics, which are a mean over processes, so every process of a multi-process run stops
at the same step with the same weights.

The voice check (``ppo.voice_check_tokens``) looks once, at the end, at what the watch cannot see: the final weights'
replies at the length people read, to the held-out eval prompts. The rollouts are short and come four prompts a
step, and replayed on 83 runs the watch stopped 12 runs that kept the voice and 8 that lost it (BENCHMARKS.md).
It reads two views of the replies: sampled ones (PPO's temperature, ``ppo.voice_check_tokens`` long, what people
chatting hear) and (``ppo.voice_check_gate``) the very replies the retrain's evaluation will show the gate's guard
(at ``eval.reply_temperature``, the serving temperature by default, ``eval.max_new_tokens`` long). When either
view's replies trip the gate's own distinct-2, repetition or length check against the starting weights' (same
prompts, same sampling noise), the check goes back through the run's checkpoints, latest first, and keeps the first
whose replies pass in both: a retrain that overshoots then publishes the last weights that still sounded like the
version it started from, instead of a version the gate's guard will refuse. When no checkpoint passes in both views,
it keeps the latest weights whose sampled replies pass (the guard will refuse them, but what an admin may still
promote by hand sounds like the policy), and the final weights when none does.

With ``ppo.voice_check_blends`` N the way back has more stops than the checkpoints: the final weights' change from
the start, scaled to (N-1)/N, ..., 1/N of itself (the trainable weights interpolated toward the ones the run started
from, saved in ``run_dir/start``). A blend goes back along the direction the whole run learned rather than to where
the run was earlier, as WiSE-FT (Wortsman et al. 2022) and WARP's interpolation toward the initialisation (Ramé et
al. 2024) do for fine-tuned and RL-tuned weights. By default (``ppo.voice_check_blend_order`` "last") the blends
are tried, furthest first, only once every checkpoint has lost the voice: on the runs a checkpoint rescues, a blend
of equal progress had learned less (BENCHMARKS.md), so blends are for the runs the guard would otherwise refuse.
With "progress", blends and checkpoints are tried together, furthest along first: a blend of a/1 sits at the
progress of the checkpoint after step a x the final step, and is tried before it.
"""
from __future__ import annotations

import logging
import statistics
from pathlib import Path
from typing import Optional, Sequence

import torch

from rlhf.training.checkpoint import STEP_DIR, checkpoints_dir, load_policy_weights, save_policy
from rlhf.voice import distinct_dropped, distinct_n, length_changed, repeats_more, repetition, words

log = logging.getLogger(__name__)

START = "start"  # run_dir/start: the weights the run started from, where the voice check's blends lead back


def trainable_copy(policy) -> dict:
    """The policy's trainable weights, copied to the CPU (what a stop or a way back puts back)."""
    return {n: p.detach().to("cpu", copy=True) for n, p in policy.named_parameters() if p.requires_grad}


def restore(policy, weights: dict) -> None:
    """Put ``weights`` (from ``trainable_copy``) back into the policy."""
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if name in weights:
                p.copy_(weights[name].to(p.device))


def voice_drift(history: Sequence[dict], rise: float, drop: float, window: int) -> Optional[str]:
    """Why the last ``window`` steps' rollouts (``voice/repetition``, ``voice/distinct2`` per step) no longer sound
    like the first step's, by the thresholds ``rise`` and ``drop`` (0 = that check off); None while they do."""
    first, recent = history[0], history[-window:]
    up = statistics.mean(m["voice/repetition"] for m in recent) - first["voice/repetition"]
    down = first["voice/distinct2"] - statistics.mean(m["voice/distinct2"] for m in recent)
    if rise > 0 and up > rise:
        return f"repeated 3-grams up {up:.3f} (ppo.stop_repetition_rise={rise})"
    if drop > 0 and down > drop:
        return f"distinct-2 down {down:.3f} (ppo.stop_distinct_drop={drop})"
    return None


class VoiceWatch:
    """Watches the rollouts' voice step by step; ``check`` restores the last vouched-for weights and says why when
    the voice has drifted."""

    def __init__(self, cfg, policy, step: int = 0):
        self.rise, self.drop, self.window = cfg.stop_repetition_rise, cfg.stop_distinct_drop, cfg.stop_window
        self.policy = policy
        # The weights the next step's rollouts come from, and the last ones whose rollouts kept the voice (until a
        # check passes: the starting ones, also on a resumed run), each with the step after which they were taken.
        self.pending, self.pending_step = self._copy(), step
        self.vouched, self.vouched_step = self.pending, step

    @staticmethod
    def wanted(cfg) -> bool:
        return cfg.stop_repetition_rise > 0 or cfg.stop_distinct_drop > 0

    def _copy(self) -> dict:
        return trainable_copy(self.policy)

    def drift(self, history: Sequence[dict]) -> Optional[str]:
        """Why the last ``window`` steps' rollouts no longer sound like the first step's (None while they do)."""
        return voice_drift(history, self.rise, self.drop, self.window)

    def check(self, history: Sequence[dict]) -> Optional[str]:
        """After a step (``history`` ends with it): None while the voice holds; otherwise the reason, with the
        policy's trainable weights put back to the last ones vouched for."""
        reason = self.drift(history)
        if reason is None:
            self.vouched, self.vouched_step = self.pending, self.pending_step
            self.pending, self.pending_step = self._copy(), len(history)
            return None
        restore(self.policy, self.vouched)
        log.warning("PPO voice watch: %s at step %d; keeping the weights after step %d", reason, len(history),
                    self.vouched_step)
        return reason


def voice_of(replies: Sequence[str]) -> dict:
    """The three measures the gate's guard reads of a voice: distinct-2 over the replies, the mean share of repeated
    3-grams within a reply, and the mean words a reply."""
    return {"distinct_2": distinct_n(replies),
            "repetition": statistics.mean(repetition(r) for r in replies) if replies else 0.0,
            "words": statistics.mean(len(words(r)) for r in replies) if replies else 0.0}


def voice_lost(now: dict, start: dict, gate) -> Optional[str]:
    """Why replies measured ``now`` (``voice_of``) no longer sound like ``start``, by the gate's guard (``gate``: its
    config section: the distinct-2 drop, the repetition ratio and rise, the length ratios); None while they do. A
    ``start`` measured before lengths were kept (a checkpoint of an older run) skips the length rule."""
    if distinct_dropped(now["distinct_2"], start["distinct_2"], gate.max_distinct_drop):
        return (f"distinct-2 {start['distinct_2']:.3f} -> {now['distinct_2']:.3f} "
                f"(gate.max_distinct_drop={gate.max_distinct_drop})")
    if repeats_more(now["repetition"], start["repetition"], gate.max_repetition_ratio, gate.max_repetition_rise):
        return (f"repeated 3-grams {start['repetition']:.3f} -> {now['repetition']:.3f} (gate.max_repetition_ratio="
                f"{gate.max_repetition_ratio}, gate.max_repetition_rise={gate.max_repetition_rise})")
    if "words" in start and length_changed(now["words"], start["words"], gate.min_length_ratio, gate.max_length_ratio):
        return (f"words a reply {start['words']:.1f} -> {now['words']:.1f} (gate.min_length_ratio="
                f"{gate.min_length_ratio}, gate.max_length_ratio={gate.max_length_ratio})")
    return None


VIEWS = {"sampled": "sampled replies", "gate": "the gate's replies"}  # what each view of the check reads


def views_lost(now: dict, start: dict, gate) -> Optional[str]:
    """``voice_lost`` on each view measured both ``now`` and at the ``start`` (``VoiceCheck.measure``), the reason
    naming the view; a ``start`` of an older run (one flat voice: its sampled replies) is read as that view."""
    if "distinct_2" in start:
        start = {"sampled": start}
    for view, voice in now.items():
        if view in start and (reason := voice_lost(voice, start[view], gate)) is not None:
            return f"{VIEWS.get(view, view)}: {reason}"
    return None


class VoiceCheck:
    """The end-of-run voice check: ``measure`` reads the policy's voice on the eval prompts in each view
    (``samplers``: view -> a function returning the policy's replies, the same noise each call), ``settle`` keeps
    the final weights, or the first earlier weights in ``_candidates``' order (the checkpoints furthest along first,
    and with ``ppo.voice_check_blends`` blends of the final weights with the start) whose voice passes in every
    view."""

    def __init__(self, config, policy, samplers: dict):
        self.gate, self.policy = config.gate, policy
        self.samplers = samplers
        self.blends, self.blends_last = config.ppo.voice_check_blends, config.ppo.voice_check_blend_order == "last"

    @staticmethod
    def wanted(cfg) -> bool:
        return cfg.voice_check_tokens > 0

    def measure(self) -> dict:
        return {view: voice_of(sample()) for view, sample in self.samplers.items()}

    def keep_start(self, run_dir: Path) -> None:
        """Save the weights the run starts from (``run_dir/start``), where the blends lead back; only with blends."""
        if self.blends:
            save_policy(self.policy, Path(run_dir) / START, {"step": 0})

    def _candidates(self, run_dir: Path, final_step: int, final: dict) -> list[tuple]:
        """``(step, blend, put)`` for every earlier weights the check may keep, in the order it tries them: the
        checkpoints before ``final_step`` (``blend`` None) and the blends a/1 of ``final`` with the start (``step`` =
        the final step), furthest along first, the blends after every checkpoint (order "last") or each before the
        checkpoint as far along ("progress"); ``put()`` puts those weights into the policy."""
        found = [(int(m.group(1)), d) for d in checkpoints_dir(run_dir).glob("step-*")
                 if (m := STEP_DIR.match(d.name)) and 0 < int(m.group(1)) < final_step]
        out = [(step / final_step, 0, step, None, lambda d=d: load_policy_weights(self.policy, d)) for step, d in found]
        start_dir = Path(run_dir) / START
        if self.blends and not start_dir.is_dir():
            log.info("PPO voice check: no %s (a run resumed from before blends were on): checkpoints only", start_dir)
        elif self.blends:
            load_policy_weights(self.policy, start_dir)
            begin = trainable_copy(self.policy)
            restore(self.policy, final)
            for k in range(self.blends - 1, 0, -1):
                a = k / self.blends
                mixed = {n: begin[n] + a * (w - begin[n]) for n, w in final.items()}
                out.append((a, 1, final_step, round(a, 4), lambda mixed=mixed: restore(self.policy, mixed)))
        ordered = sorted(out, key=lambda c: (c[0], c[1]), reverse=True)
        if self.blends_last:
            ordered.sort(key=lambda c: c[1])  # stable: checkpoints (0) before blends (1), each furthest first
        return [c[2:] for c in ordered]

    def settle(self, start: dict, run_dir: Path, final_step: int, known: Optional[dict] = None) -> Optional[dict]:
        """None when the final weights keep the voice of ``start``; else ``{step, kept, reason, passes}`` (and
        ``blend``: the share of the final weights' change kept, when a blend is kept) with the policy on the weights
        furthest along the run whose replies pass in every view (``_candidates``). When none does, the policy is on
        the furthest weights (the final ones included) whose replies pass in the first view (what people chatting
        hear), else on the final weights (``kept`` = ``step``); the gate's guard then decides. ``passes``: "every
        view", the view the kept weights pass in, or "none". ``known``: step -> the voice already measured of the
        weights a checkpoint (or the final weights) holds after that step (the probe's), read instead of measured
        again."""
        known = known or {}
        now = known[final_step] if final_step in known else self.measure()
        reason = views_lost(now, start, self.gate)
        if reason is None:
            return None
        final = trainable_copy(self.policy)
        first = next(iter(self.samplers))
        heard = None  # (step, blend, put) of the furthest weights whose first view passes
        if views_lost({first: now[first]}, start, self.gate) is None:
            heard = (final_step, None, lambda: restore(self.policy, final))
        for step, blend, put in self._candidates(run_dir, final_step, final):
            if blend is None and step in known:  # the probe's measure: the policy is not on these weights yet
                now, loaded = known[step], False
            else:
                put()
                now, loaded = self.measure(), True
            if views_lost(now, start, self.gate) is None:
                if not loaded:
                    put()
                log.warning("PPO voice check: %s after step %d; keeping %s", reason, final_step, _kept(step, blend))
                return {"step": final_step, "kept": step, "reason": reason, "passes": "every view",
                        **({"blend": blend} if blend is not None else {})}
            if heard is None and views_lost({first: now[first]}, start, self.gate) is None:
                heard = (step, blend, put)
        passes = VIEWS.get(first, first) if heard is not None else "none"
        step, blend, put = heard or (final_step, None, lambda: restore(self.policy, final))
        put()
        log.warning("PPO voice check: %s after step %d, and no earlier weights keep the voice in every view; "
                    "keeping %s (passes: %s)", reason, final_step, _kept(step, blend), passes)
        return {"step": final_step, "kept": step, "reason": reason, "passes": passes,
                **({"blend": blend} if blend is not None else {})}


def _kept(step: int, blend: Optional[float]) -> str:
    """The weights the check keeps, in words."""
    if blend is None:
        return f"the weights after step {step}"
    return f"{blend:.0%} of the change the run made by step {step} (a blend with the start)"


class VoiceProbe:
    """The voice probe (``ppo.voice_probe_every``): the voice check's views, measured during the run on the weights
    after every N-th step; each time they have lost the voice of the start, the trainer raises the KL coefficient
    (``ppo.voice_probe_kl`` times), pulling the policy back toward the base while the votes and the reward model go
    on teaching. The weights stay where they are: the voice measured on the eval prompts is noisy from one
    checkpoint to the next (a run whose step 4 lost it had it back at step 8), so going back is left to the
    end-of-run check, which reads what the probe measured (``seen``) instead of sampling the same weights again.
    Ending the vote steps instead let the reward model's steps drift further (BENCHMARKS.md).

    ``measure`` runs on the main process (the check's samplers live there); the trainer shares its verdict."""

    def __init__(self, every: int):
        self.every = every
        self.seen: dict = {}  # step -> the voice of the weights the policy held after that step (for the check)

    @staticmethod
    def wanted(cfg) -> bool:
        return cfg.voice_probe_every > 0 and VoiceCheck.wanted(cfg)

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def measure(self, check: VoiceCheck, start: dict, step: int) -> Optional[str]:
        """Why the weights after ``step`` lost the voice of ``start`` in some view of ``check``; None while kept."""
        now = check.measure()
        self.seen[step] = now
        return views_lost(now, start, check.gate)
