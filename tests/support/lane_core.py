"""An engine core that decodes like llama.cpp's lanes, with the one habit that leaked the arena's blind sides: each
version's replies decode in their own lane, one lane after the other, always in the same order (adapter versions
first, the base last). Its text is made up ("w1 w2 ..."); no model runs.

A real lane's decode takes time, so the reader of the first lane's reply has its token before the next lane even
starts: here a lane waits until the previous lane's tokens were taken off their streams (no clock involved).
"""
from __future__ import annotations

import threading

from rlhf.serving.interface import EngineCore, Request


class LaneOrderCore(EngineCore):
    """Fixed lane order, ``words`` tokens per reply (fewer if ``max_new_tokens`` says so)."""

    name = "lane-order"

    def __init__(self, tokenizer, words: int = 4):
        self.tokenizer = tokenizer
        self.words = words
        self.rows: list[tuple[Request, list[int]]] = []  # a request and how many words it has emitted
        self._adapters: set[str] = set()
        self._drained = threading.Event()  # never set: its wait is the loop's pause between two checks

    @property
    def running(self) -> int:
        return len(self.rows)

    def admit(self, requests: list[Request]) -> list[Request]:
        self.rows += [(req, [0]) for req in requests]
        return []

    def step(self) -> None:
        lanes: dict = {}
        for req, count in self.rows:
            lanes.setdefault(req.adapter, []).append((req, count))
        for adapter in sorted(lanes, key=lambda a: (a is None, a or "")):  # adapters first, the base last
            for req, count in lanes[adapter]:
                self._advance(req, count)
            self._wait_read(req for req, _ in lanes[adapter])
        self.rows = [(req, count) for req, count in self.rows if not req.stream.finished]

    def _advance(self, req: Request, count: list[int]) -> None:
        stream = req.stream
        if stream.cancelled or count[0] >= min(self.words, req.params.max_new_tokens):
            stream.close()
            return
        count[0] += 1
        stream.n_tokens += 1
        stream.emit(f" w{count[0]}")

    def _wait_read(self, requests) -> None:
        for req in requests:
            while not (req.stream._queue.empty() or req.stream.cancelled):
                self._drained.wait(0.0005)

    def set_threads(self, threads: int) -> None:
        pass

    def load_adapter(self, name: str, path: str) -> None:
        self._adapters.add(name)

    def unload_adapter(self, name: str) -> None:
        self._adapters.discard(name)

    @property
    def adapters(self) -> list[str]:
        return sorted(self._adapters)

    def fail_all(self, error: BaseException) -> None:
        for req, _ in self.rows:
            req.stream.close(error)
        self.rows = []
