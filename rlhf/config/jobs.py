"""The ``retrain``, ``gate``, ``scheduler`` and ``queue`` sections: when jobs run and what they may publish."""
from __future__ import annotations

from dataclasses import dataclass

from rlhf.config.fields import Checked, ConfigError, one_of, opt
from rlhf.registry import METHODS


@dataclass(frozen=True)
class RetrainRule:
    """When to retrain an agent automatically: ``scheduler.*`` holds the default, the Store one per agent, and
    ``rlhf.retrain.triggers`` applies it."""

    enabled: bool
    min_new_feedback: int
    min_interval_minutes: float
    cron: str = ""


@dataclass
class RetrainConfig(Checked):
    method: str = opt("ppo", "ppo | dpo | rpo | online_dpo: how the policy learns the votes: PPO on the reward model, "
                      "DPO on the preference pairs themselves, RPO (DPO plus the chosen replies' likelihood), or "
                      "online DPO (the votes plus pairs of the policy's own replies the reward model ranks); the "
                      "reward model is fitted either way: the gate and the vote queue read it.")
    auto_promote: bool = opt(True, "Make a candidate that passes the gate the active version.")
    min_win_rate: float = opt(0.5, "Gate: least reward-model win rate of candidate vs active.")
    max_kl: float = opt(20.0, "Gate: largest KL to base (nats per reply) a candidate may have (= ppo.kl_limit).")
    resume_interrupted: bool = opt(False, "Resume jobs interrupted by a crash instead of failing them.")
    job_threads: int = opt(0, "CPU threads of a training job (0 = half the cores, at least 1); serving gives "
                           "them up while the job runs.")
    job_nice: int = opt(10, "Niceness of the job process (0-19): on a contended core chat goes first.")
    idle_cores_after_seconds: float = opt(15.0, "A running job takes serving's cores too once no chat reply has "
                                          "been in flight this long (0 = never); a chat that starts gets them back "
                                          "within a second.")
    heartbeat_seconds: float = opt(2.0, "How often a running job writes its heartbeat.")
    stale_after_seconds: float = opt(60.0, "A running job without heartbeat this long is dead.")

    def check(self) -> None:
        """Raise ConfigError naming the key when a value cannot work (called at load)."""
        one_of("retrain.method", self.method, tuple(METHODS))
        if self.idle_cores_after_seconds < 0:
            raise ConfigError(f"retrain.idle_cores_after_seconds: expected 0 (never) or more seconds, got "
                              f"{self.idle_cores_after_seconds}")


@dataclass
class GateConfig(Checked):
    """How a retrained version gets promoted: held-out judge, reward-hacking guard, and people's votes."""
    judge_share: float = opt(0.33, "Share of preference pairs (whole conversations) kept out of PPO's reward model "
                             "to fit the gate's judge, which PPO never optimised (0 = no judge: people decide).")
    min_judge_pairs: int = opt(32, "Fewest pairs in the judge's share and in PPO's share; fewer: no judge, every "
                               "pair trains and people decide (32 at share 0.33: a judge from 94 decided pairs; "
                               "a judge of fewer costs the policy a third of its votes, #40).")
    guard: bool = opt(True, "Check candidate vs active replies for reward hacking before any promotion.")
    max_length_ratio: float = opt(2.0, "Guard: trips when the candidate's mean reply length (words) is over this "
                                  "many times the active one's.")
    min_length_ratio: float = opt(0.33, "Guard: trips when it is under this many times the active one's.")
    max_distinct_drop: float = opt(0.05, "Guard: trips when distinct-2 of the candidate's replies is this much (or "
                                   "more) below the active one's.")
    max_repetition_ratio: float = opt(2.0, "Guard: trips when the candidate's share of repeated 3-grams within a reply "
                                      "is over this many times the active one's (and max_repetition_rise above it).")
    max_repetition_rise: float = opt(0.02, "Guard: the repetition check trips only when the candidate's share is also "
                                     "more than this above the active one's (a floor for a base that never repeats).")
    min_relevance: float = opt(0.25, "Guard: a reply is off-prompt when the base model finds it hardly more likely "
                               "after its own prompt than after another (nats per token).")
    max_off_prompt_rise: float = opt(0.15, "Guard: trips when the candidate's share of off-prompt replies is this "
                                     "much above the active one's.")
    guard_max_kl: float = opt(18.0, "Guard: trips when the candidate's KL to base (nats per reply) is above this "
                              "(retrain.max_kl rejects outright).")
    decision_rule: str = opt("auto", "auto or ask: when people's votes decide, promote/archive at once, or wait for "
                             "an admin's click.")
    decision_alpha: float = opt(0.05, "Error rate of the people's-vote test (always-valid: checking after every "
                                "vote is fine).")
    decision_max_votes: int = opt(200, "Votes after which an undecided comparison ends as 'no difference' (the "
                                  "active version stays).")
    decision_check_seconds: float = opt(30.0, "How often the scheduler settles decided comparisons.")
    decision_min_annotators: int = opt(3, "Fewest different people whose blind votes a decision needs (team and HF "
                                       "modes; local mode is one person: a decided comparison waits for the admin).")
    decision_votes_per_annotator: int = opt(3, "Most votes of one person a decision counts (their first blind votes "
                                            "on it): nobody outvotes the team by voting often.")
    decision_annotators: list = opt([], "Annotator names whose blind votes people's decisions count (empty = every "
                                    "signed-in account's). With HF sign-in anyone with an account votes, so an "
                                    "automatic decision there waits for an admin unless this list is set.")

    def check(self) -> None:
        """Raise ConfigError naming the key when a value cannot work (called at load)."""
        if not 0 <= self.judge_share < 1:
            raise ConfigError(f"gate.judge_share must be in [0, 1), got {self.judge_share}")
        if self.decision_rule not in ("auto", "ask"):
            raise ConfigError(f"gate.decision_rule must be auto or ask, got {self.decision_rule!r}")
        if not 0 < self.decision_alpha < 0.5:
            raise ConfigError(f"gate.decision_alpha must be in (0, 0.5), got {self.decision_alpha}")
        if self.decision_max_votes < 1 or self.min_judge_pairs < 2:
            raise ConfigError("gate.decision_max_votes must be >= 1 and gate.min_judge_pairs >= 2")
        if not all(isinstance(n, str) and n.strip() for n in self.decision_annotators):
            raise ConfigError("gate.decision_annotators must be a list of annotator names")
        if self.decision_min_annotators < 1 or self.decision_votes_per_annotator < 1:
            raise ConfigError("gate.decision_min_annotators and gate.decision_votes_per_annotator must be >= 1")
        if not 0 < self.min_length_ratio <= 1 <= self.max_length_ratio:
            raise ConfigError("gate.min_length_ratio must be in (0, 1] and gate.max_length_ratio >= 1")
        if self.max_repetition_ratio < 1 or self.max_repetition_rise < 0 or self.max_distinct_drop < 0:
            raise ConfigError("gate.max_repetition_ratio must be >= 1, gate.max_repetition_rise and "
                              "gate.max_distinct_drop >= 0")


@dataclass
class SchedulerConfig(Checked):
    enabled: bool = opt(True, "Run the background scheduler in the app.")
    poll_seconds: float = opt(5.0, "How often the job queue is drained.")
    check_minutes: float = opt(5.0, "How often the retrain trigger rule is evaluated.")
    min_new_feedback: int = opt(32, "New ratings/comparisons that trigger an automatic retrain.")
    min_interval_minutes: float = opt(60.0, "Least time between automatic retrains of an agent.")
    cron: str = opt("", "Optional crontab expression that also triggers a retrain.")
    auto_retrain: bool = opt(False, "Enqueue retrains automatically (admins can turn this on in the UI).")
    job_kinds: dict = opt({}, "Extra job kinds: name -> import path 'mod:fn'; fn(ctx) -> result dict, imported by the "
                          "job process that runs one (the built-in kinds, rlhf.registry.JOB_KINDS, cannot be replaced).")

    def check(self) -> None:
        """Raise ConfigError naming the key when a value cannot work (called at load)."""
        for name, path in self.job_kinds.items():
            module, sep, attr = str(path).partition(":")
            if not (str(name).isidentifier() and sep and module and attr):
                raise ConfigError(f"scheduler.job_kinds: expected name: 'package.module:function', got "
                                  f"{name!r}: {path!r}")

    def default_rule(self) -> RetrainRule:
        """The retrain trigger rule of an agent that has none stored."""
        return RetrainRule(self.auto_retrain, self.min_new_feedback, self.min_interval_minutes, self.cron)


@dataclass
class QueueConfig(Checked):
    refill: bool = opt(True, "Refill each agent's vote queue in the background while chat is idle (with "
                       "scheduler.enabled; the Vote tab and /queue API work either way).")
    low_water: int = opt(8, "Refill when fewer unseen items than this are ready.")
    target_ready: int = opt(24, "Refill up to this many unseen ready items per agent.")
    batch_size: int = opt(4, "Items generated together in one refill batch (two replies each).")
    max_new_tokens: int = opt(0, "Reply length of queue items in tokens (0 = the agent's default).")
    temperature: float = opt(0.9, "Sampling temperature of queue replies (two samples of one version must differ).")
    prompt_file: str = opt("", "Extra prompts for the queue (JSONL/TXT); empty = the starter set in assets/. Prompts "
                           "users typed are always in the pool.")
    random_share: float = opt(0.2, "Share of items picked at random instead of by the reward model's uncertainty.")
    refit_every: int = opt(8, "Refit the queue's reward head (and rescore the items) after this many new pairs.")
    overlap_every: int = opt(10, "Every Nth item also goes to a second annotator, for agreement (0 = never).")
    ttl_hours: float = opt(24.0, "An item expires this long after it was made; a vote on it is refused.")
    lease_minutes: float = opt(10.0, "An item shown to an annotator is held for them this long; unvoted, it goes "
                               "to others (never back to them).")
    poll_seconds: float = opt(5.0, "How often the refill worker looks at the queue (votes also wake it).")
    read_ms: int = opt(400, "After a vote, the Vote tab ignores input until the next pair has been on screen this long "
                            "(ms), so a double click, tap or key cannot vote on a pair nobody read.")

    def check(self) -> None:
        """Raise ConfigError naming the key when a value cannot work (called at load)."""
        if self.read_ms < 0:
            raise ConfigError(f"queue.read_ms must be >= 0, got {self.read_ms}")
        if not 0 <= self.random_share <= 1:
            raise ConfigError(f"queue.random_share must be in [0, 1], got {self.random_share}")
        if min(self.batch_size, self.refit_every) < 1 or self.low_water < 0 or self.target_ready < self.low_water:
            raise ConfigError("queue.batch_size and queue.refit_every must be >= 1, and 0 <= queue.low_water <= "
                              "queue.target_ready")
