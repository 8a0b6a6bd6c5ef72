"""The commit and heartbeat rules of a streaming subscriber, fed the clock's reading."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsafe.gateway.admission.fair_queue import AdmissionCore
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.generations.store import MemoryEventLog
from streamsafe.gateway.generations.waiting import wait_for_change
from streamsafe.gateway.serving.pacing import (
    COMMIT,
    HEARTBEAT,
    MIN_CLIENT_HEARTBEAT,
    SHED,
    STEP_BACK,
    UNSTATED_READ_TIMEOUT,
    WAIT,
    Pacing,
    StreamRules,
    heartbeat_within,
)
from streamsafe.gateway.upstream.kinds import KINDS

#: The route of a chat completion to vLLM (every request has its route).
CHAT = KINDS["vllm"].route("/v1/chat/completions")

pytestmark = pytest.mark.unit


def _generation(created_at: float = 100.0, *, queued: bool = False) -> Generation:
    """A generation admitted at ``created_at`` or, with ``queued``, waiting for a place since
    then (behind one that holds the only place)."""
    req = GenerationRequest(
        tenant="t",
        path="/v1/chat/completions",
        body=b"{}",
        fingerprint=b"f",
        cost=1,
        stream=True,
        route=CHAT,
    )
    gen = Generation("gen-1", req, MemoryEventLog(), None, created_at)
    if queued:
        core = AdmissionCore(1, None, 10)
        core.request("t", 1, None, created_at)
        gen.waiter, _ = core.request("t", 1, None, created_at)
    else:
        gen.state, gen.admitted_at = State.RUNNING, created_at
    return gen


def _rules(**kwargs: Any) -> StreamRules:
    return StreamRules.from_config(GatewayConfig(**kwargs))


def test_early_commit_waits_at_most_commit_wait_from_arrival_while_queued() -> None:
    gen = _generation(created_at=100.0, queued=True)
    pacing = Pacing(_rules(heartbeat=0.5), flowing=False, arrived=100.0)
    step, timeout = pacing.step(gen, 100.2)
    assert step == WAIT and timeout == pytest.approx(0.3)
    assert pacing.step(gen, 100.5) == (COMMIT, None)
    assert pacing.committed


def test_no_commit_before_the_generation_asked_for_a_place() -> None:
    gen = _generation(created_at=100.0)
    gen.state, gen.admitted_at = State.QUEUED, None  # its reader has not asked yet
    pacing = Pacing(_rules(heartbeat=0.5), flowing=False, arrived=100.0)
    assert pacing.step(gen, 1e9) == (WAIT, None)


def test_early_commit_waits_for_the_first_token_while_the_wait_is_short_of_the_read_timeout() -> (
    None
):
    gen = _generation(created_at=0.0, queued=True)
    rules = _rules(heartbeat=0.5, queue_timeout=100.0)
    pacing = Pacing(rules, flowing=False, arrived=0.0, patience=60.0)
    assert pacing.step(gen, 5.0, predicted=2.0)[0] == WAIT  # no commit: a 429 stays possible
    assert pacing.step(gen, 5.0, predicted=25.0) == (COMMIT, None)  # may reach 30 s: commit


def test_a_wait_past_the_queue_timeout_is_shed_before_any_commit() -> None:
    gen = _generation(created_at=0.0, queued=True)
    pacing = Pacing(_rules(queue_timeout=10.0), flowing=False, arrived=0.0)
    assert pacing.step(gen, 0.0, predicted=12.0) == (SHED, None)
    assert pacing.retry_after == 12.0 and not pacing.committed


def test_first_token_commit_tells_a_client_that_would_time_out_to_come_back() -> None:
    gen = _generation(created_at=0.0, queued=True)
    rules = _rules(commit="first-token")
    pacing = Pacing(rules, flowing=False, arrived=0.0, patience=4.0)
    assert pacing.step(gen, 0.0, predicted=1.0) == (WAIT, 2.0)  # answer by half the timeout
    assert pacing.step(gen, 0.5, predicted=8.0) == (STEP_BACK, None)
    assert pacing.retry_after == pytest.approx(9.0) and not pacing.committed  # just after


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
    pacing = Pacing(_rules(heartbeat=2.0), flowing=False, patience=10.0)
    assert pacing.step(gen, 1.0) == (COMMIT, None)
    assert pacing.step(gen, 2.0) == (WAIT, 1.0)
    assert pacing.step(gen, 3.0) == (HEARTBEAT, 2.0)
    assert pacing.step(gen, 4.5) == (WAIT, 0.5)
    pacing.flowing = True
    assert pacing.step(gen, 100.0) == (WAIT, None)


@given(
    heartbeat=st.floats(0.01, 30.0),
    patience=st.floats(0.05, 60.0),
    ticks=st.lists(st.floats(0.001, 2.0), min_size=1, max_size=60),
)
def test_a_client_that_said_its_read_timeout_hears_from_the_stream_twice_within_it(
    heartbeat: float, patience: float, ticks: list[float]
) -> None:
    # The client's read timeout (x-stainless-read-timeout) may be under the heartbeat interval:
    # then it must still get a byte at least every half of it, from the commit on, however the
    # waits fall. Driven as the subscriber drives it: after a commit it asks again at once;
    # otherwise it waits for the time asked, or less (a change woke it).
    gen = _generation(created_at=0.0)
    pacing = Pacing(_rules(heartbeat=heartbeat), flowing=False, patience=patience)
    now, last_byte = 0.0, None
    for tick in ticks:
        step, timeout = pacing.step(gen, now)
        if step in (COMMIT, HEARTBEAT):
            if last_byte is not None:
                assert now - last_byte <= heartbeat_within(heartbeat, patience) + 1e-9
            last_byte = now
        if step != COMMIT:
            now += tick if timeout is None else min(tick, timeout)


@given(
    heartbeat=st.floats(0.01, 30.0),
    patience=st.one_of(st.none(), st.floats(-1.0, 120.0)),
)
def test_heartbeats_come_twice_within_a_stated_read_timeout_but_never_spin(
    heartbeat: float, patience: float | None
) -> None:
    beat = heartbeat_within(heartbeat, patience)
    assert 0 < beat <= heartbeat
    # A client that states nothing is taken to wait 3 s (ogx-client, curl with -m 3).
    stated = patience if patience is not None and patience > 0 else UNSTATED_READ_TIMEOUT
    # Twice within the read timeout where that is a quarter second or more apart; a client
    # stating less (x-stainless-read-timeout: 0.0001 made the gateway write 56,000 heartbeats
    # in 3 s) gets one every quarter second, or the operator's shorter interval.
    assert beat <= stated / 2 or beat == min(heartbeat, MIN_CLIENT_HEARTBEAT)
    assert beat >= min(heartbeat, MIN_CLIENT_HEARTBEAT)


def test_a_client_that_states_no_read_timeout_hears_from_the_stream_within_3_s() -> None:
    # ogx-client states none and was not kept alive under about 5 s (first heartbeat at 6.1 s).
    gen = _generation(created_at=0.0)
    pacing = Pacing(_rules(heartbeat=5.0), flowing=False)
    assert pacing.step(gen, 1.0) == (COMMIT, None)
    assert pacing.step(gen, 2.5) == (HEARTBEAT, 1.5)
    assert pacing.step(gen, 4.0) == (HEARTBEAT, 1.5)


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
    beat = heartbeat_within(heartbeat, None)
    assert all(b - a >= beat for a, b in itertools.pairwise(beats))


@pytest.mark.parametrize("timeout", [0.0, -1.0, 0.01])
def test_a_wait_that_is_already_due_returns_under_uvloop(timeout: float) -> None:
    # uvloop answers call_later/call_at with a past deadline with a plain Handle (no when()):
    # the gateway process runs on uvloop, where this once failed every heartbeat wait.
    import uvloop

    async def wait() -> int:
        gen = _generation()
        await wait_for_change(gen, timeout)
        return len(gen._waiters)

    assert uvloop.run(wait()) == 0  # the timed-out waiter is off the waiting list
