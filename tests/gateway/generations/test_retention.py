"""Retention: finished generations kept within a byte and a count bound, each let go once it was
kept for the retention time, by one timer for all of them."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsafe.gateway.generations.event_log import MemoryEventLog
from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.generations.retention import Retention
from streamsafe.gateway.upstream.kinds import KINDS

#: The route of a chat completion to vLLM (every request has its route).
CHAT = KINDS["vllm"].route("/v1/chat/completions")

pytestmark = pytest.mark.unit


def finished(i: int, at: float, payload: bytes = b"{}") -> Generation:
    req = GenerationRequest("t", "/v1/chat/completions", b"", b"fp%d" % i, 1, True, route=CHAT)
    gen = Generation(f"gen-{i}", req, MemoryEventLog(), None)
    gen.log.append_nowait([payload])
    gen.finished_at = at
    return gen


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 100), max_size=30),
    st.floats(0, 50),
    st.lists(st.floats(0, 200), max_size=10),
)
def test_expired_lets_go_exactly_those_kept_long_enough_oldest_first(steps, keep_for, nows):
    retention = Retention(10**9, 10**6, keep_for)
    at, gens = 0.0, []
    for i, step in enumerate(steps):
        at += step
        gens.append(finished(i, at))
        assert retention.keep(gens[-1]) == []
    gone: list[Generation] = []
    for now in sorted(nows):
        out = retention.expired(now)
        assert out == [g for g in gens if g not in gone and g.finished_at + keep_for <= now]
        gone += out
        left = [g for g in gens if g not in gone]
        assert len(retention) == len(left)
        assert retention.due() == (left[0].finished_at + keep_for if left else None)
    assert retention.bytes == sum(g.kept_nbytes for g in gens if g not in gone)


def test_past_a_bound_the_oldest_are_evicted_first() -> None:
    retention = Retention(max_bytes=10**9, max_generations=2)
    gens = [finished(i, float(i)) for i in range(4)]
    assert retention.keep(gens[0]) == [] and retention.keep(gens[1]) == []
    assert retention.keep(gens[2]) == [gens[0]]
    small = Retention(max_bytes=gens[0].kept_nbytes * 2, max_generations=100)
    for gen in gens[:3]:
        small.keep(gen)
    assert len(small) == 2 and small.expired(10.0) == gens[1:3]


async def test_one_timer_lets_each_go_when_its_time_is_up() -> None:
    now = [0.0]
    forgotten: list[Generation] = []
    changed = asyncio.Event()

    def forget(gen: Generation) -> None:
        forgotten.append(gen)
        changed.set()

    retention = Retention(10**9, 100, 0.05, forget, clock=lambda: now[0])
    first, second = finished(0, 0.0), finished(1, 0.03)
    retention.keep(first)
    retention.keep(second)
    now[0] = 0.05  # the first is due, the second not yet
    await asyncio.wait_for(changed.wait(), 5)
    changed.clear()
    assert forgotten == [first] and len(retention) == 1
    now[0] = 1.0
    await asyncio.wait_for(changed.wait(), 5)
    assert forgotten == [first, second] and len(retention) == 0
    retention.close()
