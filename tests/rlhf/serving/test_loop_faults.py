"""A core that fails twice over — its step raises, then its own clean-up raises — still never leaves a person
waiting: the loop ends every reply the core held with an error, and serves the next request."""
from __future__ import annotations

import pytest

from rlhf.serving.interface import GenParams, ReplyStream, Request
from rlhf.serving.loop import EngineLoop
from tests.support.lane_core import LaneOrderCore


class BrokenOnce(LaneOrderCore):
    """Its first step raises, and so does the ``fail_all`` that follows; afterwards it decodes as usual."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.broken = True

    def step(self) -> None:
        if self.broken:
            raise RuntimeError("a kernel failed")
        super().step()

    def fail_all(self, error: BaseException) -> None:
        if self.broken:
            self.broken, self.rows = False, []  # forgets its replies without ending them
            raise RuntimeError("clean-up failed too")
        super().fail_all(error)


def ask(loop: EngineLoop) -> ReplyStream:
    stream = ReplyStream()
    loop.submit(Request([1, 2, 3], None, GenParams(max_new_tokens=3, temperature=0), stream))
    return stream


def test_replies_a_failing_core_forgot_end_with_an_error_and_the_next_is_served(tokenizer):
    loop = EngineLoop(lambda: BrokenOnce(tokenizer))
    try:
        with pytest.raises(RuntimeError, match="generation failed"):
            ask(loop).text()  # ended by the loop, not left waiting
        assert ask(loop).text() == " w1 w2 w3"
    finally:
        loop.close()
