"""A simulated team of annotators: drives the REST API with a built-in oracle preference.

For each prompt it asks the active version for two replies (different seeds), lets the oracle pick
the better one, and posts the comparison and thumbs, exactly as people would in the browser. With
``--retrain`` it then triggers a retrain, waits for it, and measures how often the oracle prefers
the new version over the old on held-out prompts that were never voted on.
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import httpx

ROOT = Path(__file__).resolve().parents[2]
POLITE = ("please", "thank", "happy to help", "glad", "you're welcome", "hope this helps", "sorry", "kindly")
LIST_LINE = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+", re.MULTILINE)


def _words(text: str) -> int:
    return len(text.split())


def concise(prompt: str, a: str, b: str) -> str:
    """Prefers the shorter reply (an empty reply always loses); within 10% is a tie."""
    la, lb = _words(a), _words(b)
    if la == 0 or lb == 0:
        return "tie" if la == lb else ("b" if la == 0 else "a")
    if abs(la - lb) <= 0.1 * max(la, lb):
        return "tie"
    return "a" if la < lb else "b"


def polite(prompt: str, a: str, b: str) -> str:
    """Prefers the reply with more polite phrases."""
    pa, pb = (sum(t.lower().count(w) for w in POLITE) for t in (a, b))
    return "tie" if pa == pb else ("a" if pa > pb else "b")


def no_lists(prompt: str, a: str, b: str) -> str:
    """Prefers prose over bulleted or numbered lists."""
    la, lb = len(LIST_LINE.findall(a)), len(LIST_LINE.findall(b))
    return "tie" if la == lb else ("a" if la < lb else "b")


def concrete(prompt: str, a: str, b: str) -> str:
    """Prefers the reply with more concrete numbers, quantities and explicit steps (content, not length)."""
    from rlhf.bench.preference_pool import concrete_hits

    ca, cb = concrete_hits(a), concrete_hits(b)
    return "tie" if ca == cb else ("a" if ca > cb else "b")


ORACLES: dict[str, Callable[[str, str, str], str]] = {"concise": concise, "polite": polite, "no-lists": no_lists,
                                                      "concrete": concrete}


def distinct_2(texts: list[str]) -> float:
    """Share of distinct word bigrams over all bigrams (1.0 = no repetition; collapse drives it toward 0)."""
    grams = [tuple(ws[i:i + 2]) for t in texts for ws in [t.split()] for i in range(len(ws) - 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def starter_prompts(path: Optional[Path] = None) -> list[str]:
    """The shipped starter prompts (assets/prompts.jsonl)."""
    path = path or ROOT / "assets" / "prompts.jsonl"
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]


def vote_and_eval_prompts() -> tuple[list[str], list[str]]:
    """Prompts to vote on and held-out prompts to judge on: the preference pool's fixed split (no overlap)."""
    from rlhf.bench.preference_pool import load_pool, split_prompts

    pool = load_pool()
    train_ids, held_ids = split_prompts(pool)
    text = {r["prompt_id"]: r["prompt"] for r in pool}
    return [text[i] for i in train_ids], [text[i] for i in held_ids]


class Annotators:
    """REST client playing annotators named ``sim-<oracle>``."""

    def __init__(self, url: str, oracle: str, agent: Optional[str] = None, max_new_tokens: int = 64,
                 token: Optional[str] = None):
        if oracle not in ORACLES:
            raise ValueError(f"unknown oracle {oracle!r}; choose from {sorted(ORACLES)}")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url.rstrip("/") + "/api/v1", timeout=300, headers=headers)
        self.oracle, self.judge, self.agent = oracle, ORACLES[oracle], agent
        self.name = f"sim-{oracle}"
        self.max_new_tokens = max_new_tokens

    def _post(self, path: str, body: dict) -> dict:
        r = self.http.post(path, json=body)
        if r.status_code >= 400:
            raise RuntimeError(f"POST {path} → {r.status_code}: {r.text}")
        return r.json()

    def pair(self, prompt: str, seed: int, policy_a: Optional[int] = None, policy_b: Optional[int] = None):
        """Two replies to the same new conversation state (the second is a regeneration: a sibling)."""
        body = {"messages": [{"role": "user", "content": prompt}], "seed": seed, "temperature": 1.0,
                "max_new_tokens": self.max_new_tokens, "annotator": self.name}
        if self.agent:
            body["agent"] = self.agent
        if policy_a is not None:
            body["policy_id"] = policy_a
        a = self._post("/chat", body)
        regen = {"seed": seed + 1, "temperature": 1.0, "max_new_tokens": self.max_new_tokens}
        if policy_b is not None:
            regen["policy_id"] = policy_b
        b = self._post(f"/messages/{a['message_id']}/regenerate", regen)
        return a, b

    def vote(self, prompt: str, seed: int) -> str:
        """One annotation round: two replies, the oracle's comparison, thumbs for winner and loser."""
        a, b = self.pair(prompt, seed)
        winner = self.judge(prompt, a["content"], b["content"])
        self._post("/comparisons", {"message_a_id": a["message_id"], "message_b_id": b["message_id"],
                                    "winner": winner, "annotator": self.name})
        if winner in ("a", "b"):
            good, bad = (a, b) if winner == "a" else (b, a)
            self._post("/feedback", {"message_id": good["message_id"], "thumb": 1, "annotator": self.name})
            self._post("/feedback", {"message_id": bad["message_id"], "thumb": -1, "annotator": self.name})
        return winner

    def retrain(self, overrides: Optional[dict] = None, timeout: float = 3600, progress=None) -> dict:
        """Trigger a retrain and wait for it to end; returns the final job."""
        body = {"config": overrides or {}}
        if self.agent:
            body["agent"] = self.agent
        job_id = self._post("/train", body)["job_id"]
        deadline = time.time() + timeout
        while time.time() < deadline:
            job = self.http.get(f"/jobs/{job_id}").json()
            if progress:
                progress(job)
            if job["status"] in ("succeeded", "failed", "cancelled"):
                return job
            time.sleep(2)
        raise TimeoutError(f"retrain job {job_id} did not finish in {timeout:.0f} s")

    def oracle_win_rate(self, prompts: list[str], old: int, new: int, seed: int = 10_000,
                        samples: int = 2) -> dict:
        """How often the oracle prefers the new version's reply over the old one's (ties half), with fluency
        figures of the new version's replies (mean words, distinct-2, empty share)."""
        from tqdm import tqdm

        score, n, new_texts = 0.0, 0, []
        for i, prompt in enumerate(tqdm(prompts, desc="oracle verdict", file=sys.stderr)):
            for s in range(samples):
                old_reply, new_reply = self.pair(prompt, seed + 2 * (samples * i + s), policy_a=old, policy_b=new)
                verdict = self.judge(prompt, new_reply["content"], old_reply["content"])
                score += {"a": 1.0, "tie": 0.5, "b": 0.0}[verdict]
                n += 1
                new_texts.append(new_reply["content"])
        words = [len(t.split()) for t in new_texts]
        return {"oracle_win_rate": round(score / max(1, n), 3), "judged": n,
                "mean_words": round(sum(words) / max(1, len(words)), 1), "distinct_2": round(distinct_2(new_texts), 3),
                "empty": sum(1 for w in words if w == 0)}


def simulate(url: str, oracle: str, votes: int, retrain: bool = False, agent: Optional[str] = None,
             eval_prompts: int = 32, overrides: Optional[dict] = None, max_new_tokens: int = 64,
             token: Optional[str] = None, log=lambda msg: print(msg, file=sys.stderr), samples: int = 2) -> dict:
    """Run the whole loop against a running app and return the contract's JSON figures."""
    from tqdm import tqdm

    team = Annotators(url, oracle, agent, max_new_tokens, token)
    train, held = vote_and_eval_prompts()
    held_out = held[:eval_prompts]
    winners = {}
    for i in tqdm(range(votes), desc=f"{oracle} votes", file=sys.stderr):
        w = team.vote(train[i % len(train)], seed=2 * i)
        winners[w] = winners.get(w, 0) + 1
    log(f"votes: {winners}")
    out = {"votes": votes, "job_id": None, "new_policy_id": None, "oracle_win_rate": None,
           "reward_before": None, "reward_after": None}
    if not retrain:
        return out
    agents = team.http.get("/agents").json()
    old = next(a for a in agents if agent in (None, a["name"]))["active_policy_id"]
    bar = tqdm(total=100, desc="retrain", file=sys.stderr)

    def show(job):
        bar.n = int(job["progress"] * 100)
        bar.set_postfix_str(job["phase"])
        bar.refresh()

    job = team.retrain(overrides, progress=show)
    bar.close()
    out["job_id"] = job["id"]
    if job["status"] != "succeeded":
        raise RuntimeError(f"retrain job {job['id']} {job['status']}: {job.get('error')}")
    new = job["result"]["policy_id"]
    metrics = job["result"].get("metrics", {})
    out.update(new_policy_id=new, reward_before=metrics.get("eval/active_reward"),
               reward_after=metrics.get("eval/reward"), promoted=job["result"].get("promoted"),
               gate=job["result"].get("gate"), rm_cv_accuracy=metrics.get("reward_model/cv_accuracy"),
               rm_cv_low=metrics.get("reward_model/cv_low"), rm_cv_high=metrics.get("reward_model/cv_high"),
               retrain_seconds=round(sum((job["result"].get("phase_seconds") or {}).values()), 1),
               **team.oracle_win_rate(held_out, old, new, samples=samples))
    return out
