"""The vote queue's background worker: keep each agent's queue stocked with scored items, never ahead of chat.

One thread in the app process. On each tick (every ``queue.poll_seconds``, and at once after a vote), per agent:

1. **Score.** When the Store holds ``reward.min_pairs`` preference pairs, the reward head (the retrain's own fit,
   ``rlhf.training.reward_head.fit_preference_head``, on the same features) is refit on them every
   ``queue.refit_every`` new pairs, and every open
   item not yet scored by the current fit gets P(A ≻ B) and its uncertainty (``rlhf.vote_queue.choice``) stored
   with it. Handing out an item is then a query: nothing is scored on the request path.
2. **Refill.** While fewer than ``queue.low_water`` unseen items are open, up to ``queue.target_ready``: take
   prompts from the pool (the starter set or ``queue.prompt_file``, plus contexts users typed, deduplicated by
   context and never twice for the same two versions), and sample two replies to each from the active version
   and the newest candidate (two samples of the active one when there is no candidate), ``queue.batch_size``
   items per batch on the app's own PolicyServer.

Chat goes first (the serving layer says when it is idle and which requests are not ours): a batch starts only after
the server has had no request for ``IDLE_S`` seconds; its items go
in one at a time (a forward pass cannot be interrupted, so a chat that arrives waits for at most two refill
prompts' prefill or one decode step); and the whole batch is cancelled (nothing stored, retried later) as soon as
a request that is not the refill's own shows up in the server. Feature extraction runs in small chunks, each
after the same idle wait, on one CPU thread.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from rlhf.config import AppConfig
from rlhf.vote_queue.choice import pair_uncertainty
from rlhf.vote_queue.contexts import PoolPrompt, prompt_pool, queue_params, queue_versions
from rlhf.serving.policy_server import AdapterError, AdapterRef, Busy, PolicyServer
from storage import Agent, Policy, Store, StoreError

log = logging.getLogger(__name__)

IDLE_S = 0.5  # the server must have been idle this long before a refill batch or a feature chunk starts
POLL_S = 0.02  # how often a running batch looks for live requests
FEATURE_CHUNK = 8  # replies per feature forward pass between two idle checks
MAX_MEMO = 20_000  # cached reply features (about 9 KB each on the default model) before the cache is cleared


@dataclass
class _Fit:
    head: object  # rlhf.training.reward_head.LinearHead
    pairs: int


class QueueRefill:
    """The background thread (``start``/``stop``/``poke``); ``tick(agent)`` is one round, callable from tests."""

    def __init__(self, store: Store, config: AppConfig, server_for: Callable[[Agent], Optional[PolicyServer]],
                 seed: Optional[int] = None, idle_s: float = IDLE_S):
        self.store, self.config, self.server_for = store, config, server_for
        self.rng = np.random.default_rng(seed)
        self.idle_s = idle_s
        self.counts = {"items": 0, "batches": 0, "preempted": 0, "refits": 0, "scored": 0}
        self._fits: dict[int, _Fit] = {}  # agent id -> the head that scores its items
        self._watermarks: dict[int, dict] = {}  # agent id -> feedback watermark when its pairs were last counted
        self._skip: set[tuple] = set()  # (context key, version ids) that gave no usable item
        self._features = None
        self._memo: dict[tuple, np.ndarray] = {}
        self._mark = 0  # the server's requests_seen() when the running batch started
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.thread: Optional[threading.Thread] = None

    # ---- thread --------------------------------------------------------------------------------
    def start(self) -> "QueueRefill":
        self.thread = threading.Thread(target=self._run, name="queue-refill", daemon=True)
        self.thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the current step (a running batch is cancelled)."""
        self._stop.set()
        self._wake.set()
        if self.thread is not None:
            self.thread.join(timeout)

    def poke(self) -> None:
        """Look at the queue now (after a vote: it may have run low, and there are new pairs to learn from)."""
        self._wake.set()

    def _run(self) -> None:
        from rlhf.cpu import apply_torch_threads

        apply_torch_threads(1)  # this thread's forward passes (features) take one core, never chat's share
        while not self._stop.is_set():
            for agent in self.store.list_agents():
                if self._stop.is_set():
                    break
                try:
                    self.tick(agent)
                except Exception:  # a bad prompt, a broken version, a locked DB: log, keep the thread alive
                    log.exception("vote queue refill for agent %s failed", agent.name)
            self._wake.wait(self.config.queue.poll_seconds)
            self._wake.clear()

    # ---- one round -----------------------------------------------------------------------------
    def tick(self, agent: Agent) -> int:
        """Score what needs scoring, then refill while the queue is low (scoring after each batch); returns the
        items made. An agent without a server in memory (``server_for`` gives None) is left alone."""
        if self.server_for(agent) is None:
            return 0
        self.score(agent)
        return self.refill(agent)

    def _fresh(self, agent: Agent) -> int:
        q = self.config.queue
        return len(self.store.open_queue_items(agent.id, q.lease_minutes * 60, self.config.reward.exclude_annotators,
                                               fresh_only=True))

    def refill(self, agent: Agent) -> int:
        """Generate items while fewer than ``queue.low_water`` unseen ones are open, up to ``queue.target_ready``."""
        q = self.config.queue
        fresh = self._fresh(agent)
        if fresh >= q.low_water:
            return 0
        made, pool = 0, None
        while fresh + made < q.target_ready and not self._stop.is_set():
            versions = queue_versions(self.store, agent)
            ids = (versions[0].id, versions[1].id)
            if pool is None:
                pool = prompt_pool(self.store, self.config, agent)
            used = self.store.queue_context_keys(agent.id, ids)
            todo = [p for p in pool if p.key not in used and (p.key, ids) not in self._skip]
            if not todo:
                break
            batch = todo[:min(q.batch_size, q.target_ready - fresh - made)]
            created = self.generate(agent, versions, batch)
            if created is None:  # preempted by chat, busy or stopping: try again on a later tick
                break
            made += created
            self.score(agent)  # votes may have come in meanwhile: keep the scores fresh between batches
        return made

    def generate(self, agent: Agent, versions: tuple[Policy, Policy], batch: list[PoolPrompt]) -> Optional[int]:
        """Two replies to each prompt of ``batch``, stored as items; None when chat came first (nothing stored)."""
        server = self.server_for(agent)
        for policy in versions:
            try:
                server.ensure_adapter(AdapterRef(policy.id, policy.adapter_path))
            except AdapterError as exc:  # as in chat: the version is marked broken and no longer offered
                self.store.mark_policy_broken(policy.id, str(exc))
                return None
        if not self.wait_idle(server):
            return None
        self._mark = server.requests_seen()  # replies asked for from here on that are not ours are chat
        jobs = []  # (prompt index, policy, params, stream)
        for i, prompt in enumerate(batch):
            try:
                for policy in versions:
                    params = queue_params(self.config, agent, int(self.rng.integers(2**31)))
                    jobs.append((i, policy, params, server.stream(agent.system_prompt or "", list(prompt.history),
                                                                  AdapterRef(policy.id, policy.adapter_path), params,
                                                                  agent.chat_template)))
            except Busy:
                self._cancel([job[3] for job in jobs])
                return None
            # One item's prompts per prefill: a forward pass cannot be interrupted, so chat never waits for
            # more than two refill prompts to be prefilled (or one decode step).
            if not self._watch(server, [job[3] for job in jobs], started=True):
                self.counts["preempted"] += 1
                return None
        streams = [job[3] for job in jobs]
        if not self._watch(server, streams):
            self.counts["preempted"] += 1
            return None
        try:
            texts = [s.text() for s in streams]
        except RuntimeError:  # the engine failed the batch (it logged why)
            return None
        self.counts["batches"] += 1
        return sum(self._store_item(agent, versions, prompt, jobs[2 * i:2 * i + 2], texts[2 * i:2 * i + 2])
                   for i, prompt in enumerate(batch))

    def _store_item(self, agent: Agent, versions: tuple, prompt: PoolPrompt, jobs: list, texts: list) -> int:
        ids = (versions[0].id, versions[1].id)
        if not all(t.strip() for t in texts) or texts[0].strip() == texts[1].strip():
            self._skip.add((prompt.key, ids))  # nothing to compare: not asked again for these two versions
            return 0
        replies = [{"content": text, "policy_id": policy.id, "gen_params": params.to_dict(),
                    "latency_ms": round(stream.latency_ms, 1), "n_tokens": stream.n_tokens}  # ✂️ on a cut reply
                   for (_, policy, params, stream), text in zip(jobs, texts)]
        if self.rng.random() < 0.5:  # sides at random: A is not always the active version
            replies.reverse()
        q = self.config.queue
        try:
            self.store.create_queue_item(agent.id, list(prompt.history), replies, prompt.source, q.overlap_every,
                                         q.ttl_hours * 3600)
        except StoreError as exc:  # e.g. a typed context with an empty turn: skipped for good
            log.info("vote queue: prompt %s skipped: %s", prompt.key, exc)
            self._skip.add((prompt.key, ids))
            return 0
        self.counts["items"] += 1
        return 1

    # ---- chat priority ---------------------------------------------------------------------------
    def wait_idle(self, server: PolicyServer) -> bool:
        """Block until the server has had no request for ``idle_s`` seconds (False: stopping).

        Idle (``PolicyServer.idle``) = nothing waiting, nothing running, and no model call under way.
        """
        quiet_since = None
        while not self._stop.is_set():
            if server.idle():
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= self.idle_s:
                    return True
            else:
                quiet_since = None
            time.sleep(POLL_S)
        return False

    def _watch(self, server: PolicyServer, streams: list, started: bool = False) -> bool:
        """Wait until every stream finished (``started``: has its first token, i.e. was prefilled); cancel them all
        as soon as a live request is in the server. True when the wait ended without a live request."""
        waiting_for = (lambda s: s.first_token_at is None and s.finished_at is None) if started else \
            (lambda s: s.finished_at is None)
        seen = 0
        while any(waiting_for(s) for s in streams):
            arrived, present = server.others(self._mark, streams)
            # Also a request that slipped in just before the batch: more replies in the server than ours still open
            # (a reply of ours that just finished stays counted for a moment, hence three polls in a row).
            seen = seen + 1 if present > 0 else 0
            if arrived > 0 or seen >= 3 or self._stop.is_set():
                self._cancel(streams)
                return False
            time.sleep(POLL_S)
        return not any(s.cancelled for s in streams)

    @staticmethod
    def _cancel(streams: list) -> None:
        for s in streams:
            s.cancel()
        for s in streams:  # let the engine drop them before the next batch is considered
            try:
                s.text()
            except RuntimeError:
                pass

    # ---- scoring ---------------------------------------------------------------------------------
    def score(self, agent: Agent) -> int:
        """Refit the head when ``queue.refit_every`` new pairs arrived, then score open items it has not scored;
        returns how many were scored (0 before there are ``reward.min_pairs`` pairs)."""
        from rlhf.training.data import build_pairs
        from rlhf.training.reward_head import fit_preference_head

        r, q = self.config.reward, self.config.queue
        fit = self._fits.get(agent.id)
        watermark = self.store.feedback_watermark(agent.id)
        if watermark != self._watermarks.get(agent.id):  # new feedback since the last look
            pairs = build_pairs(self.store.feedback_rows(agent.id), r.exclude_annotators, r.margin_per_score,
                                r.rated_vs_unrated)
            if len(pairs) >= r.min_pairs and (fit is None or len(pairs) - fit.pairs >= q.refit_every):
                xc = self._featurize([p["prompt"] for p in pairs], [p["chosen"] for p in pairs], agent)
                xr = self._featurize([p["prompt"] for p in pairs], [p["rejected"] for p in pairs], agent)
                if xc is None or xr is None:
                    return 0
                fit = self._fits[agent.id] = _Fit(fit_preference_head(xc, xr, pairs, r), len(pairs))
                self.counts["refits"] += 1
            self._watermarks[agent.id] = watermark
        if fit is None:
            return 0
        items = [i for i in self.store.open_queue_items(agent.id, q.lease_minutes * 60, r.exclude_annotators)
                 if i.scored_pairs != fit.pairs]
        if not items:
            return 0
        prompts, replies_a, replies_b = [], [], []
        for item in items:
            system, history = self.store.queue_item_context(item)
            prompts.append(([{"role": "system", "content": system}] if system else []) + history)
            replies_a.append(self.store.get_message(item.message_a_id).content)
            replies_b.append(self.store.get_message(item.message_b_id).content)
        xa, xb = self._featurize(prompts, replies_a, agent), self._featurize(prompts, replies_b, agent)
        if xa is None or xb is None:
            return 0
        p_a, uncertainty = pair_uncertainty(fit.head.preference(xa, xb))
        self.store.set_queue_scores(zip([i.id for i in items], p_a, uncertainty), fit.pairs)
        self.counts["scored"] += len(items)
        return len(items)

    def _featurize(self, prompts: list, replies: list, agent: Agent) -> Optional[np.ndarray]:
        """Reply features (memoised), computed in small chunks, each after the server went idle; None: stopping."""
        from rlhf.training.features import feature_key

        keys = [feature_key(p, r) for p, r in zip(prompts, replies)]
        todo = [i for i, k in enumerate(keys) if k not in self._memo]
        if todo:
            features = self.features()
            if len(self._memo) + len(todo) > MAX_MEMO:
                self._memo.clear()
                todo = list(range(len(keys)))
            server = self.server_for(agent)
            for start in range(0, len(todo), FEATURE_CHUNK):
                if not self.wait_idle(server):
                    return None
                chunk = todo[start:start + FEATURE_CHUNK]
                for i, row in zip(chunk, features([prompts[i] for i in chunk], [replies[i] for i in chunk])):
                    self._memo[keys[i]] = row
        return np.stack([self._memo[k] for k in keys])

    def features(self):
        """The reward features the queue scores with (loaded on first use): the retrain's own
        (``rlhf.training.features.reward_features``, same prompt budget), memoised here in chunks."""
        if self._features is None:
            from rlhf.base_models import pick_device, resolve_model
            from rlhf.training.features import reward_features

            source = resolve_model(self.config.base_model, self.config.data_path)
            self._features = reward_features(self.config, pick_device(self.config.device), source,
                                             batch_size=FEATURE_CHUNK, memo=False)
            log.info("vote queue: reply features of %s loaded for scoring", Path(source).name)
        return self._features

