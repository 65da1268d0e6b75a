"""The leaderboard never makes anyone wait: readers get the last table while one refit per agent runs, votes during
a fit cause one more fit, a vote flipped back fits nothing, and the arena's pairing never queues behind a fit.

The fit (``rlhf.analysis.arena.board``) is wrapped so that it can be held on an Event: what these tests check is
who waits for whom, never how long anything takes. Each test's Leaderboards gets the wrapper as its own ``fit``, so
no other test's refit thread (an app's, still running in this worker) can count or hold as one of its fits."""
from __future__ import annotations

import threading

import pytest

from rlhf.analysis import arena as pairing
from ui.state.leaderboard import Leaderboards

HOLD = 60  # a safety net only: a held fit is always released by the test


class Fits:
    """Counts the full fits (the pairing's n_boot=0 ones apart) and can hold the next one until released."""

    def __init__(self):
        self.full, self.pairing = [], []
        self.held, self.release, self.done = threading.Event(), threading.Event(), threading.Event()
        self.hold_next = False
        real = pairing.board

        def board(votes, policies, n_boot=pairing.BOOTSTRAP_ROUNDS, **kwargs):
            if n_boot == 0:
                self.pairing.append(len(votes))
                return real(votes, policies, n_boot=0, **kwargs)
            self.full.append(len(votes))
            if self.hold_next:
                self.hold_next = False
                self.held.set()
                assert self.release.wait(HOLD), "the test never released the held fit"
            try:
                return real(votes, policies, n_boot=2, **kwargs)
            finally:
                self.done.set()

        self.board = board

    def hold(self):
        self.hold_next = True
        self.held.clear(), self.release.clear(), self.done.clear()


def flip(store, pair, winner):
    a, b = pair
    return store.record_comparison(a.id, b.id, winner, "ann")


@pytest.fixture
def board(store, tmp_path):
    """Two versions of the default agent and one pair of their replies, voted once."""
    v0 = store.active_policy("assistant")
    (tmp_path / "v1").mkdir()
    v1 = store.register_policy_version("assistant", str(tmp_path / "v1"), v0.id, promote=False)
    conv = store.create_conversation("assistant", "ann", messages=[{"role": "user", "content": "q"}])
    user = store.leaf(conv.id)
    pair = store.record_reply(user.id, "one", v0.id), store.record_reply(user.id, "two", v1.id)
    flip(store, pair, "a")
    return pair


@pytest.fixture
def fits():
    return Fits()


def votes_of(table) -> int:
    return int(table["votes"].max())  # two versions: every vote is each one's


def test_a_reader_gets_the_last_table_while_a_refit_runs_and_many_votes_cause_one_more_fit(store, board, fits):
    boards = Leaderboards(store, refit_seconds=0, fit=fits.board)
    try:
        assert votes_of(boards.table("assistant")) == 1 and fits.full == [1]
        second = store.create_conversation("assistant", "bob", messages=[{"role": "user", "content": "q2"}])
        user = store.leaf(second.id)
        more = [store.record_reply(user.id, text, reply.policy_id) for text, reply in zip("xy", board)]
        fits.hold()
        store.record_comparison(more[0].id, more[1].id, "a", "bob")
        assert votes_of(boards.table("assistant")) == 1  # the last table, while its refit starts behind it
        assert fits.held.wait(HOLD)
        for i in range(6):  # votes flipping while the refit is held: readers still get the last table at once
            flip(store, board, "ab"[i % 2])
            assert votes_of(boards.table("assistant")) == 1
        assert not fits.release.is_set() and fits.full == [1, 2]
        fits.done.clear()
        fits.release.set()
        assert fits.done.wait(HOLD)
        # the refit fitted the votes as they were when it started: the six flips since cost one more fit, no more
        assert votes_of(boards.table("assistant", fresh=True)) == 2 and fits.full == [1, 2, 2]
    finally:
        fits.release.set()
        boards.close()


def test_a_vote_flipped_back_fits_nothing(store, board, fits):
    boards = Leaderboards(store, refit_seconds=0, fit=fits.board)
    try:
        boards.table("assistant")
        flip(store, board, "b")
        flip(store, board, "a")  # back where it was: the counted votes are what the table was fitted on
        assert votes_of(boards.table("assistant", fresh=True)) == 1 and fits.full == [1]
        flip(store, board, "b")
        table = boards.table("assistant", fresh=True)
        assert fits.full == [1, 1] and table.set_index("policy_id").loc[board[1].policy_id, "wins"] == 1
    finally:
        boards.close()


def test_refits_wait_for_the_interval_and_readers_never_do(store, board, fits):
    boards = Leaderboards(store, refit_seconds=3600, fit=fits.board)
    try:
        boards.table("assistant")  # the first table (nothing to serve before it)
        flip(store, board, "b")
        boards.table("assistant")  # a refit is due, but only an hour after the last one started
        for _ in range(5):
            flip(store, board, "ab"[_ % 2])
            boards.table("assistant")
        assert fits.full == [1]  # nobody waited for a fit, and none was started
    finally:
        boards.close()


def test_the_arenas_pairing_does_not_queue_behind_a_fit(store, board, fits):
    boards = Leaderboards(store, refit_seconds=0, fit=fits.board)
    try:
        boards.table("assistant")
        fits.hold()
        flip(store, board, "b")
        boards.table("assistant")  # starts the full refit, which is held
        assert fits.held.wait(HOLD)
        pair_table = boards.table("assistant", n_boot=0, with_text=False)  # the pairing's first table
        assert votes_of(pair_table) == 1 and fits.pairing == [1] and not fits.release.is_set()
    finally:
        fits.release.set()
        boards.close()
