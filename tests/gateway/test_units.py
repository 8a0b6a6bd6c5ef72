"""The pure parts: admission decisions (hypothesis), the memory store, SSE framing."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from streamsafe.gateway.admission import Admission, AdmissionCore, Shed, request_cost
from streamsafe.gateway.store import MemoryStore
from streamsafe.sse import SSEDecoder, encode_events

ops = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.integers(1, 60)),
        st.tuples(st.just("finish"), st.integers(0, 50)),
        st.tuples(st.just("withdraw"), st.integers(0, 50)),
    ),
    max_size=80,
)


@given(ops, st.integers(1, 5), st.integers(60, 200), st.integers(0, 6))
@settings(max_examples=200, deadline=None)
def test_admission_never_exceeds_limits_and_admits_in_order(
    script: list[tuple[str, int]], max_inflight: int, max_memory: int, queue_size: int
) -> None:
    core = AdmissionCore(max_inflight, max_memory, queue_size)
    running: list[int] = []
    waiting = []
    admitted_order: list[int] = []
    from_queue: list[int] = []
    arrivals = 0
    now = 0.0
    for op, arg in script:
        now += 0.1
        if op == "arrive":
            arrivals += 1
            if core.try_admit(arg):
                running.append(arg)
                admitted_order.append(arrivals)
            else:
                w = core.enqueue(arg, arrivals)
                if w is not None:
                    waiting.append(w)
        elif op == "finish" and running:
            cost = running.pop(arg % len(running))
            for w in core.release(cost, now):
                running.append(w.cost)
                from_queue.append(w.token)
                waiting.remove(w)
        elif op == "withdraw" and waiting:
            w = waiting.pop(arg % len(waiting))
            for a in core.remove(w):
                running.append(a.cost)
                from_queue.append(a.token)
                waiting.remove(a)
        assert core.inflight == len(running) <= max_inflight
        assert core.memory == sum(running) <= max_memory
        assert len(core.queue) <= queue_size
    # Waiters are admitted in arrival order (FIFO).
    assert from_queue == sorted(from_queue)


def test_retry_after_follows_the_observed_completion_rate() -> None:
    core = AdmissionCore(1, None, 10)
    assert core.retry_after(0.0, fallback=7) == 7  # nothing observed yet
    core.try_admit(1)
    for t in range(5):  # one completion per second
        core.release(1, float(t))
        core.try_admit(1)
    for i in range(4):
        core.enqueue(1, i)
    assert core.retry_after(4.0, fallback=99) == 5  # 4 ahead + itself at 1/s
    for i in range(4):
        core.release(1, 4.0 + (i + 1) * 0.01)  # completions speed up: shorter wait
    assert core.retry_after(4.05, fallback=99) < 5


def test_request_cost_counts_prompt_and_completion_limit() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "abcd" * 10}]}
    assert request_cost(body, 100) == 2 + 4 + 10 + 100
    assert request_cost({**body, "max_tokens": 5}, 100) == 21
    assert request_cost({**body, "max_completion_tokens": 7, "max_tokens": 5}, 100) == 23
    assert request_cost({**body, "max_tokens": 5, "n": 2}, 100) == 42


async def test_admission_queue_times_out_with_shed_and_frees_nothing_it_did_not_hold() -> None:
    adm = Admission(max_inflight=1, max_memory_tokens=None, queue_size=1, queue_timeout=0.01)
    ticket = await adm.acquire(1)
    try:
        await adm.acquire(1)
    except Shed as exc:
        assert exc.retry_after >= 1
    else:  # pragma: no cover
        raise AssertionError("not shed")
    assert adm.queued == 0 and adm.inflight == 1
    waiter = asyncio.create_task(adm.acquire(1))
    await asyncio.sleep(0)
    try:
        await adm.acquire(1)  # queue (size 1) is full: shed at once
    except Shed as exc:
        assert "full" in exc.reason
    adm.release(ticket)
    second = await waiter
    assert adm.inflight == 1
    adm.release(second)
    adm.release(second)  # idempotent
    assert adm.inflight == 0 and adm.memory == 0


async def test_cancelled_waiter_hands_its_place_on() -> None:
    adm = Admission(max_inflight=1, max_memory_tokens=None, queue_size=5, queue_timeout=5)
    ticket = await adm.acquire(1)
    a = asyncio.create_task(adm.acquire(1))
    b = asyncio.create_task(adm.acquire(1))
    await asyncio.sleep(0)
    a.cancel()
    adm.release(ticket)  # a was cancelled in the same instant: b must get the place
    got = await asyncio.wait_for(b, 1)
    assert adm.inflight == 1
    adm.release(got)
    assert adm.inflight == 0


async def test_memory_store_claim_is_set_nx_and_release_is_compare_and_delete() -> None:
    now = [0.0]
    store = MemoryStore(clock=lambda: now[0])
    assert await store.claim("k", "g1") is None
    assert await store.claim("k", "g2") == "g1"
    await store.release("k", "g2")  # not the owner: no effect
    assert await store.owner("k") == "g1"
    await store.expire("k", "g1", 5.0)
    now[0] = 6.0
    assert await store.owner("k") is None
    assert await store.claim("k", "g2") is None
    log = store.log("g2")
    assert await log.append([b"a", b"bc"]) == 2
    assert await log.read(1) == [b"bc"]
    assert log.nbytes > 3
    await store.drop_log("g2")
    assert store.log_count == 0


@given(st.lists(st.binary(min_size=1, max_size=30).filter(lambda b: b"\r" not in b), max_size=20))
def test_frames_decode_back_to_the_same_payloads_and_ids(payloads: list[bytes]) -> None:
    multiline = any(b"\n" in p for p in payloads)
    framed = encode_events(payloads, 5, multiline)
    events = SSEDecoder().feed(framed)
    assert [e.raw for e in events] == payloads
    assert [e.id for e in events] == [str(i) for i in range(5, 5 + len(payloads))]
