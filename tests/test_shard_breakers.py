"""A question's one deadline over its shard calls, and a breaker a shard: a shard that failed is
skipped at once (the answer partial, no wait) until a probe finds it back."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from index import ClusteredIndex
from index.shards import ShardBreakers, ShardedIndex, carve, local_search, question_deadline, shard_failures


def test_a_breaker_opens_backs_off_and_a_probe_closes_it() -> None:
    b = ShardBreakers(2, base_s=0.2, max_s=1.0)
    assert b.allow(0) and b.state(0) == "closed"
    b.failed(0)
    assert b.state(0) == "open" and not b.allow(0) and b.allow(1)  # the other shard is untouched
    time.sleep(0.25)
    assert b.state(0) == "half-open"
    assert b.allow(0) and not b.allow(0)  # one probe at a time
    b.failed(0)  # the probe failed: open again, for twice as long
    time.sleep(0.25)
    assert not b.allow(0)
    time.sleep(0.2)
    assert b.allow(0)
    b.ok(0)
    assert b.state(0) == "closed" and b.allow(0) and b.allow(0)
    assert (b.errors[0], b.skipped[0]) == (2, 3)


def test_a_probe_whose_answer_is_never_read_does_not_hold_the_shard_for_good() -> None:
    b = ShardBreakers(1, base_s=0.05, max_s=0.2)
    b.failed(0)
    time.sleep(0.06)
    assert b.allow(0)  # the probe, sent; its answer never collected (neither ok nor failed)
    assert not b.allow(0)
    time.sleep(0.21)
    assert b.allow(0)  # past the longest back-off: another probe


def test_with_a_probe_of_its_own_no_question_waits_on_a_stuck_shard() -> None:
    """The probe runs on its own thread: questions skip the shard until it answers."""
    answers = [TimeoutError("still stuck"), None]
    probed: list[float] = []

    def probe(shard: int) -> None:
        time.sleep(0.05)  # a probe takes its time; no question waits for it
        probed.append(time.monotonic())
        outcome = answers.pop(0)
        if outcome is not None:
            raise outcome

    b = ShardBreakers(1, base_s=0.05, max_s=0.2, probe=probe)
    b.failed(0)
    time.sleep(0.06)
    t = time.monotonic()
    assert not b.allow(0) and time.monotonic() - t < 0.01  # half-open: probed apart, skipped meanwhile
    deadline = time.monotonic() + 2
    while b.errors[0] < 2 and time.monotonic() < deadline:  # the probe failed: open for longer
        assert not b.allow(0)
        time.sleep(0.01)
    assert b.errors[0] == 2 and b.state(0) == "open"
    while b.state(0) != "closed" and time.monotonic() < deadline:  # the next probe finds it back
        b.allow(0)
        time.sleep(0.01)
    assert b.state(0) == "closed" and b.allow(0) and len(probed) == 2
    assert b.calls[0] == 1  # no question's call was a probe


def test_with_a_probe_of_its_own_a_shard_comes_back_with_no_question_asked() -> None:
    """Its probes run when each back-off ends: readiness (`/readyz`) comes back without traffic."""
    answers: list[Exception | None] = [TimeoutError("still stuck"), None]

    def probe(shard: int) -> None:
        outcome = answers.pop(0)
        if outcome is not None:
            raise outcome

    b = ShardBreakers(1, base_s=0.05, max_s=0.2, probe=probe)
    b.failed(0)
    deadline = time.monotonic() + 2
    while b.state(0) != "closed" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b.state(0) == "closed" and b.errors[0] == 2 and not answers and b.calls[0] == 0


def _sharded(breakers: ShardBreakers, down: list[int]) -> tuple[ShardedIndex, list[int]]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, 16)).astype(np.float32)
    index = ClusteredIndex.create(rng.standard_normal((4, 16)).astype(np.float32), "v")
    index.add(x, np.arange(400), index.assign(x))
    lists = [np.array([0, 1]), np.array([2, 3])]
    asked = [0, 0]

    def shard(n: int) -> Any:
        inner = local_search(carve(index, lists[n]))

        def search(*args: Any) -> Any:
            asked[n] += 1
            if n in down:
                raise TimeoutError(f"shard {n} did not answer")
            return inner(*args)

        return search

    return ShardedIndex(index, lists, [shard(0), shard(1)], names=["a", "b"], breakers=breakers), asked


def test_a_failed_shard_is_skipped_until_its_back_off_ends() -> None:
    breakers = ShardBreakers(2, base_s=60)
    sharded, asked = _sharded(breakers, down=[1])
    q = np.ones((1, 16), dtype=np.float32) / 4
    with shard_failures() as failed:
        sharded.search(q, 5)
    assert failed == ["b"] and asked == [1, 1]  # asked, failed: named
    with shard_failures() as failed:
        _, ids = sharded.search(q, 5)
    assert failed == ["b"] and asked == [2, 1]  # skipped without a call: partial at once
    assert (ids[0] >= 0).all() and breakers.state(1) == "open" and breakers.skipped[1] == 1


class _Slow:
    """A shard's answer that never comes: its wait ends at the timeout given."""

    def result(self, timeout_s: float | None = None) -> Any:
        time.sleep(timeout_s or 0)
        raise TimeoutError


def test_a_question_has_one_deadline_for_all_its_shard_calls() -> None:
    pytest.importorskip("ray")
    from app.shards.client import _Within

    t = time.monotonic()
    with shard_failures():
        first = question_deadline(0.4)
        assert question_deadline(5.0) == first  # set once, by the question's first call
        for _ in range(3):  # three stages in turn, each waiting on a shard that never answers
            with pytest.raises(TimeoutError):
                _Within(_Slow, 0.4).result()
    took = time.monotonic() - t
    assert took < 0.4 + 0.3, took  # one budget, not three
    outside = question_deadline(1.0)  # outside a question: a call's own bound
    assert outside - time.monotonic() == pytest.approx(1.0, abs=0.05)


def test_a_pending_answer_within_the_deadline_is_awaited() -> None:
    pytest.importorskip("ray")
    from app.shards.client import _Within

    done: Future[int] = Future()
    done.set_result(7)

    class _Ready:
        def result(self, timeout_s: float | None = None) -> int:
            return done.result(timeout=timeout_s)

    with shard_failures():
        assert _Within(_Ready, 1.0).result() == 7


def test_a_call_sent_after_the_deadline_was_spent_is_not_the_shard_s_fault() -> None:
    pytest.importorskip("ray")
    from app.shards.client import _Within
    from index.shards import DeadlineSpent

    with shard_failures():
        with pytest.raises(TimeoutError) as first:
            _Within(_Slow, 0.3).result()  # the shard that is slow: its own fault
        assert not isinstance(first.value, DeadlineSpent)
        with pytest.raises(DeadlineSpent):  # the next stage's call had no time left: not this shard's
            _Within(_Slow, 0.3).result()
