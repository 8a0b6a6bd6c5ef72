"""The commit and heartbeat rules of a streaming subscriber, fed the clock's reading."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.generation import Generation, GenerationRequest, State
from streamsafe.gateway.store import MemoryEventLog
from streamsafe.gateway.subscriber import COMMIT, HEARTBEAT, WAIT, Pacing, StreamRules


def _generation(created_at: float = 100.0) -> Generation:
    req = GenerationRequest(
        tenant="t", path="/v1/chat/completions", body=b"{}", fingerprint=b"f", cost=1, stream=True
    )
    return Generation("gen-1", req, MemoryEventLog(), None, created_at)


def _rules(**kwargs: Any) -> StreamRules:
    return StreamRules.from_config(GatewayConfig(**kwargs))


def test_early_commit_waits_at_most_commit_wait_from_creation_while_queued() -> None:
    gen = _generation(created_at=100.0)
    pacing = Pacing(_rules(heartbeat=0.5), flowing=False)
    step, timeout = pacing.step(gen, 100.2)
    assert step == WAIT and timeout == pytest.approx(0.3)
    assert pacing.step(gen, 100.5) == (COMMIT, None)
    assert pacing.committed


def test_early_commit_goes_at_once_when_upstream_accepted() -> None:
    gen = _generation()
    gen.state, gen.admitted_at, gen.upstream_status = State.RUNNING, 100.0, 200
    pacing = Pacing(_rules(), flowing=False)
    assert pacing.step(gen, 100.0)[0] == COMMIT


def test_first_token_commit_never_commits_before_an_event() -> None:
    gen = _generation()
    gen.state, gen.upstream_status = State.RUNNING, 200
    pacing = Pacing(_rules(commit="first-token"), flowing=False)
    assert pacing.step(gen, 1e9) == (WAIT, None)
    assert not pacing.committed


def test_heartbeats_follow_commit_until_events_flow() -> None:
    gen = _generation(created_at=0.0)
    pacing = Pacing(_rules(heartbeat=2.0), flowing=False)
    assert pacing.step(gen, 1.0) == (COMMIT, None)
    assert pacing.step(gen, 2.0) == (WAIT, 1.0)
    assert pacing.step(gen, 3.0) == (HEARTBEAT, 2.0)
    assert pacing.step(gen, 4.5) == (WAIT, 0.5)
    pacing.flowing = True
    assert pacing.step(gen, 100.0) == (WAIT, None)


def test_no_heartbeat_when_heartbeats_are_off() -> None:
    gen = _generation(created_at=0.0)
    pacing = Pacing(_rules(heartbeat=0.0), flowing=False)
    assert pacing.step(gen, 1.0) == (COMMIT, None)
    assert pacing.step(gen, 1000.0) == (WAIT, None)


@given(
    heartbeat=st.floats(0.01, 30.0),
    times=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=30).map(sorted),
)
def test_heartbeats_are_never_closer_than_the_interval_and_no_wait_is_negative(
    heartbeat: float, times: list[float]
) -> None:
    gen = _generation(created_at=0.0)
    pacing = Pacing(_rules(heartbeat=heartbeat), flowing=False)
    beats: list[float] = []
    for now in times:
        step, timeout = pacing.step(gen, now)
        if step == HEARTBEAT:
            beats.append(now)
        assert timeout is None or timeout >= 0
    assert all(b - a >= heartbeat for a, b in itertools.pairwise(beats))
