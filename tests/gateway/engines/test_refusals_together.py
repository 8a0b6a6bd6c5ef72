"""Refused calls wait together (gateway/engines/refusal_gate.py, docs/design.md, Commit): an
engine that answered 429/503 is full; its waiting calls park in the gateway and one probe per
engine asks again, with backoff and jitter; past their bounds they fail together with the
refusal, ``Retry-After`` and ``x-should-retry: false``, and a request with the same body is
answered from that while the engine still refuses."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2
import pytest
from gateway_helpers import (
    MODEL,
    fast_sim,
    make_stack,
    raw_chat_request,
    raw_connection,
    raw_post,
    wait_for,
)

from streamsafe import Client, RetryPolicy, ServiceUnavailableError, StreamingConfig
from streamsafe.engine_sim import Fault
from streamsafe.gateway.engines.refusal_backoff import RefusalRules
from streamsafe.gateway.engines.refusal_gate import AskLedger, RefusalGate, RefusedCall
from waiting import wait_until

pytestmark = pytest.mark.timeout(60)

#: vLLM's own 503 past --max-num-queued-reqs: no Retry-After.
REFUSE_ALL = "status:503:1:none"

#: Fast rules for the shell: the same shape, in hundredths of a second.
FAST = RefusalRules(
    window=0.05, backoff=RetryPolicy(initial_delay=0.01, max_delay=0.02, max_retry_after=0.05)
)


# -- the shell --------------------------------------------------------------------------------


async def test_one_probe_asks_at_a_time_and_an_admission_lets_the_others_go_gradually() -> None:
    gate = RefusalGate(FAST, rand=lambda: 0.5)
    loop = asyncio.get_running_loop()
    asking = 0
    most_asking_while_refused = 0
    most_asking_after = 0
    refusals_left = 6

    async def engine(call: RefusedCall) -> None:
        # Refuses the first asks, then admits each call (its first token comes).
        nonlocal asking, most_asking_while_refused, most_asking_after, refusals_left
        asking += 1
        if refusals_left:
            most_asking_while_refused = max(most_asking_while_refused, asking)
        else:
            most_asking_after = max(most_asking_after, asking)
        await asyncio.sleep(0.005)  # the engine's answer time: the window others may ask in
        asking -= 1
        if refusals_left:
            refusals_left -= 1
            gate.refused(call, 503, None)
        else:
            gate.admitted(call)

    async def one() -> float | None:
        call = RefusedCall(AskLedger())
        while True:
            wait = await gate.turn(call, loop.time() + 5.0)
            if wait is not None:
                return wait
            await engine(call)
            if call.gate is None and gate.state is None:
                return None  # admitted

    first = RefusedCall(AskLedger())
    gate.refused(first, 503, None)  # the engine refused a first call: the gate closes
    results = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(8))), 10)
    assert results == [None] * 8  # every one admitted in the end
    assert most_asking_while_refused == 1  # one probe at a time while the engine refused
    # Then as the engine admits: 1, 2, 4 at once, never the 7 left all together.
    assert 1 <= most_asking_after <= 4
    assert gate.state is None and not gate.active


async def test_waiters_fail_together_with_the_next_probe_s_retry_after() -> None:
    gate = RefusalGate(RefusalRules(), rand=lambda: 0.999)
    loop = asyncio.get_running_loop()
    first = RefusedCall(AskLedger())
    gate.refused(first, 429, 8.0)  # Retry-After 8 s: past every waiter's deadline
    waits = await asyncio.wait_for(
        asyncio.gather(*(gate.turn(RefusedCall(AskLedger()), loop.time() + 2.0) for _ in range(5))),
        5,
    )
    assert all(w is not None and 7.0 < w <= 8.0 for w in waits)  # at once, not at 2 s
    assert gate.status == 429


async def test_a_generation_that_ends_on_the_engine_lets_the_next_probe_go_at_once() -> None:
    gate = RefusalGate(RefusalRules(), rand=lambda: 0.999)
    loop = asyncio.get_running_loop()
    gate.refused(RefusedCall(AskLedger()), 503, 8.0)  # the next probe in 8 s
    waiting = asyncio.create_task(gate.turn(RefusedCall(AskLedger()), loop.time() + 20.0))
    await asyncio.sleep(0)
    assert not waiting.done()
    gate.room_made()  # one of its generations ended: it has room
    assert await asyncio.wait_for(waiting, 1) is None


async def test_the_call_with_the_fewest_asks_goes_first() -> None:
    gate = RefusalGate(RefusalRules(), rand=lambda: 0.999)
    loop = asyncio.get_running_loop()
    gate.refused(RefusedCall(AskLedger()), 503, 8.0)
    spent, fresh = RefusedCall(AskLedger()), RefusedCall(AskLedger())
    spent.asks = (loop.time() - 20.0,) * 3  # arrived first, asked three times already
    order: list[RefusedCall] = []

    async def wait(call: RefusedCall) -> None:
        assert await gate.turn(call, loop.time() + 20.0) is None
        order.append(call)
        gate.done(call)

    tasks = [asyncio.create_task(wait(c)) for c in (spent, fresh)]
    await asyncio.sleep(0)
    gate.room_made()  # room for one: the call that asked least takes it
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    assert order == [fresh, spent]


async def test_a_probe_taken_while_others_run_there_waits_for_room_again() -> None:
    gate = RefusalGate(RefusalRules(), rand=lambda: 0.999)
    loop = asyncio.get_running_loop()
    gate.admitted(RefusedCall(AskLedger()), runs=True)  # one of the gateway's runs there
    gate.refused(RefusedCall(AskLedger()), 503, None)
    probe = RefusedCall(AskLedger())
    assert await gate.turn(probe, loop.time() + 20.0) is None
    gate.admitted(probe, runs=True)
    assert gate.state is not None  # full but working: the next asks when one ends
    behind = asyncio.create_task(gate.turn(RefusedCall(AskLedger()), loop.time() + 20.0))
    await asyncio.sleep(0.05)  # a while it must go on waiting through: the behaviour
    assert not behind.done()
    gate.room_made()
    assert await asyncio.wait_for(behind, 1) is None


async def test_an_ask_not_refused_within_the_patience_counts_as_admitted() -> None:
    gate = RefusalGate(FAST, rand=lambda: 0.0, patience=0.01)
    loop = asyncio.get_running_loop()
    gate.refused(RefusedCall(AskLedger()), 503, None)
    probe = RefusedCall(AskLedger())
    assert await gate.turn(probe, loop.time() + 5) is None  # goes, then hears nothing
    behind = RefusedCall(AskLedger())
    assert await asyncio.wait_for(gate.turn(behind, loop.time() + 5), 1) is None
    assert gate.state is None  # taken as admitted: the engine queued it


# -- through the gateway ----------------------------------------------------------------------


def _chat(content: str, stream: bool = True) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "stream": stream,
    }


def test_calls_an_engine_refuses_wait_together_and_fail_together() -> None:
    """8 streams and plain calls at once against an engine that refuses everything (503, no
    Retry-After): each asks once, then one probe at a time asks again; all get the refusal
    with Retry-After and x-should-retry: false. Before, each polled the engine every second
    until the queue timeout (8 calls x 4 asks in 3 s)."""
    sim = fast_sim(faults=(Fault.parse(REFUSE_ALL),))
    with make_stack(sim, queue_timeout=3.0) as s:
        bodies = [_chat(f"together {i}", stream=i % 2 == 0) for i in range(8)]
        with ThreadPoolExecutor(8) as pool, httpx2.Client(timeout=30) as http:
            answers = list(
                pool.map(lambda b: http.post(s.url + "/v1/chat/completions", json=b), bodies)
            )
        for r in answers:
            assert r.status_code == 503, r.text
            assert r.headers["x-should-retry"] == "false"
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] == 503
        received = s.sim.stats()["requests_received"]
        # Their first asks (some may arrive after the first refusal and wait without one), then
        # at most 6 probes in the 3 s (never 4 within 3 s: at most 4 here).
        assert received <= len(bodies) + 4, received

        # The same body again, marked as a retry or not: answered from the refusal at once.
        again = httpx2.post(s.url + "/v1/chat/completions", json=bodies[0], timeout=10)
        assert again.status_code == 503 and again.headers["x-should-retry"] == "false"
        assert s.sim.stats()["requests_received"] == received
        assert s.gw.stats()["refusals_answered"] == 1


def test_calls_that_wait_long_enough_are_probed_for_one_at_a_time() -> None:
    # 8 at once: their first asks (those that came before the first refusal) fill the engine's
    # window; then probes, one at a time, until the calls give up. (A timer firing a hair early
    # once left them parked, unprobed, to their deadline.)
    sim = fast_sim(faults=(Fault.parse(REFUSE_ALL),))
    with make_stack(sim, queue_timeout=8.0) as s:
        seen: list[tuple[float, int]] = []

        def poll() -> None:
            while not done.is_set():
                seen.append((time.monotonic(), s.sim.stats()["requests_received"]))
                done.wait(0.02)

        done = threading.Event()
        poller = threading.Thread(target=poll)
        poller.start()
        try:
            with ThreadPoolExecutor(8) as pool, httpx2.Client(timeout=30) as http:
                url = s.url + "/v1/chat/completions"
                bodies = [_chat(f"probed {i}", stream=i % 2 == 0) for i in range(8)]
                answers = list(pool.map(lambda b: http.post(url, json=b), bodies))
        finally:
            done.set()
            poller.join()
        assert {r.status_code for r in answers} == {503}
        first = next(t for t, n in seen if n > 0)
        later = [n for t, n in seen if t > first + 1.0]
        burst = max(n for t, n in seen if t <= first + 1.0)
        assert later and later[-1] > burst, seen[-1]  # probes came after the burst


def test_one_call_never_admitted_asks_at_most_6_times_then_gets_the_refusal() -> None:
    sim = fast_sim(faults=(Fault.parse(REFUSE_ALL),))
    lines: list[dict[str, Any]] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(dict(record.fields))  # type: ignore[attr-defined]

    access = logging.getLogger("streamsafe.access")
    level = access.level
    access.setLevel(logging.INFO)
    access.addHandler(grab := Grab())
    try:
        with make_stack(sim, queue_timeout=8.0) as s:
            r = httpx2.post(s.url + "/v1/chat/completions", json=_chat("alone"), timeout=30)
            assert r.status_code == 503 and r.headers["x-should-retry"] == "false"
            received = s.sim.stats()["requests_received"]
            assert 2 <= received <= 6
            wait_for(lambda: any("asks" in x for x in lines), what="its access line")
    finally:
        access.removeHandler(grab)
        access.setLevel(level)
    # Its plan counted each request the engine saw: the first, then the waits for room.
    (line,) = [x for x in lines if "asks" in x]
    assert line["asks"] == received
    assert line["asked"] == f"wait-for-room x{received - 1}".removesuffix(" x1")


def test_the_streamsafe_client_does_not_turn_the_gateways_refusal_into_another_round() -> None:
    # The gateway waited its round: its 503 says x-should-retry: false, so the client (which
    # would retry a 503 on a stream: nothing started) raises it at once instead of retrying.
    sim = fast_sim(faults=(Fault.parse(REFUSE_ALL),))
    with make_stack(sim, queue_timeout=1.0) as s:
        client = Client(base_url=s.url + "/v1", max_retries=2, streaming=StreamingConfig())
        with client, pytest.raises(ServiceUnavailableError):
            for _ in client.chat.completions.create(**_chat("client")):
                pass
        gw = s.gw.stats()
        assert gw["refusals_answered"] == 0  # no retry reached the gateway


def test_a_stream_sent_again_after_its_caller_left_takes_over_the_unread_copy() -> None:
    """Behind a server (OGX) a client's retry of a stream comes as a fresh call, unmarked, while
    the copy its caller abandoned still waits at the refusing engine's gate (in its grace
    period): it takes that copy over, so the three attempts of one call cost the engine one
    call's asks (at most 6), not 6 each (18 measured behind OGX)."""
    sim = fast_sim(faults=(Fault.parse(REFUSE_ALL),))
    with make_stack(sim, queue_timeout=8.0) as s:
        body = _chat("sent again by a server")
        for attempt in range(2):  # sent, waiting at the gate, abandoned
            with raw_connection(s.url) as sock:
                sock.sendall(raw_chat_request(body))
                wait_until(lambda: s.gw.stats()["subscribers"] == 1, what="a subscriber")
                asked = attempt + 1
                wait_until(lambda: s.sim.stats()["requests_received"] >= asked, what="asked")  # noqa: B023
            wait_until(lambda: s.gw.stats()["subscribers"] == 0, what="the caller gone")
        answer = raw_post(s.url, body)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        gw = s.gw.stats()
        assert (gw["generations_started"], gw["unread_adopted"]) == (1, 2), gw
        assert s.sim.stats()["requests_received"] <= 6


def test_identical_calls_waiting_at_the_gate_keep_one_call_s_bounds_together() -> None:
    """Behind a server whose client retried twice, three copies of one stream reach the gateway
    as fresh calls (unmarked, the same body), each still held open by the server: they count
    their asks together, so the engine is asked at most 6 times for the three (18 measured
    behind OGX when each asked on its own), and each gets the refusal."""
    sim = fast_sim(faults=(Fault.parse(REFUSE_ALL),))
    with make_stack(sim, queue_timeout=8.0) as s:
        body = _chat("one call, three copies")
        url = s.url + "/v1/chat/completions"
        with ThreadPoolExecutor(3) as pool, httpx2.Client(timeout=30) as http:
            answers = []
            for copy in range(3):
                answers.append(pool.submit(http.post, url, json=body))
                asked = copy + 2  # the copy before asked again since this one's arrival
                wait_until(lambda: s.sim.stats()["requests_received"] >= asked, what="asks")  # noqa: B023
            statuses = [a.result().status_code for a in answers]
        assert statuses == [503, 503, 503]
        assert s.sim.stats()["requests_received"] <= 6
