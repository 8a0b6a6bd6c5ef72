"""Costly request bodies never stall other streams (issue 23, row 3): parsing and checking a body
runs on the event loop only where it is cheap; the rest is bounded (JSON containers) and runs on
the gateway's body thread, where the interpreter switches back to the loop every few ms."""

from __future__ import annotations

import threading
import time

import httpx2
import orjson
import pytest
from gateway_helpers import MODEL, Stack, chat_body, fast_sim, make_stack

from streamsafe.gateway.serving.body_work import MAX_JSON_CONTAINERS, exceeds_containers

_SIZE = 4 * 1024 * 1024 - 1024


def _padded(field: bytes, item: bytes) -> bytes:
    """A chat body just under 4 MiB whose ``field`` is a list of ``item`` repeated."""
    head = b'{"model":"' + MODEL.encode() + b'","max_tokens":2,'
    if field != b"messages":
        head += b'"messages":[{"role":"user","content":"x"}],'
    head += b'"' + field + b'":['
    n = (_SIZE - len(head)) // (len(item) + 1)
    return head + b",".join([item] * n) + b"]}"


#: The review's costly bodies: 1.39M empty arrays (0.9 s to parse, 2.2 s in the nesting check),
#: 300k messages, 300k content parts.
COSTLY = {
    "empty arrays": _padded(b"metadata", b"[]"),
    "messages": _padded(b"messages", b'{"role":"u"}'),
    "content parts": _padded(
        b"messages",
        b'{"role":"user","content":[' + b",".join([b'{"type":"x"}'] * 1000) + b"]}",
    ),
}


def _stream_gaps(stack: Stack, ready: threading.Event, out: list[float]) -> None:
    body = chat_body(max_tokens=600)
    url = stack.url + "/v1/chat/completions"
    with httpx2.Client(timeout=30) as client, client.stream("POST", url, json=body) as r:
        last = None
        for _ in r.iter_raw():
            now = time.monotonic()
            if last is not None:
                out.append(now - last)
            last = now
            ready.set()


@pytest.mark.timeout(120)
def test_three_costly_bodies_leave_another_stream_without_a_gap_over_half_a_second() -> None:
    # Before: the body checks ran on the event loop, and every other tenant's stream paused
    # 2.3-3.6 s per such request (refused with 400 anyway).
    with make_stack(fast_sim(itl_ms=5.0), heartbeat=0.05) as stack:
        gaps: list[float] = []
        ready = threading.Event()
        reader = threading.Thread(target=_stream_gaps, args=(stack, ready, gaps))
        reader.start()
        assert ready.wait(10)
        statuses: list[int] = []

        def post(body: bytes) -> None:
            headers = {"content-type": "application/json"}
            r = httpx2.post(stack.url + "/v1/chat/completions", content=body, headers=headers)
            statuses.append(r.status_code)

        posters = [threading.Thread(target=post, args=(b,)) for b in COSTLY.values()]
        for t in posters:
            t.start()
        for t in posters:
            t.join(60)
        reader.join(60)
        assert statuses == [400, 400, 400]
        assert gaps and max(gaps) < 0.5, f"largest gap {max(gaps):.3f} s"


@pytest.mark.parametrize("name", sorted(COSTLY))
def test_a_body_past_the_container_limit_is_400_naming_it(stack: Stack, name: str) -> None:
    r = httpx2.post(
        stack.url + "/v1/chat/completions",
        content=COSTLY[name],
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 400
    assert f"{MAX_JSON_CONTAINERS:,}" in r.json()["error"]["message"]
    assert stack.sim.stats()["requests_received"] == 0


def test_brackets_inside_strings_are_not_containers() -> None:
    # A long prompt of code holds many brackets in its strings; only structure counts.
    code = "def f(x): return [x[i] for i in {1: 2}]\n" * 30_000
    raw = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": code}]})
    assert raw.count(b"[") > MAX_JSON_CONTAINERS
    assert not exceeds_containers(raw, MAX_JSON_CONTAINERS)
    escaped = b'{"a":["x\\"[{", "\\\\", [{}]]}'  # four containers, two brackets in strings
    assert exceeds_containers(escaped, 3) and not exceeds_containers(escaped, 4)


def test_a_large_body_within_the_limits_is_served() -> None:
    code = "def f(x): return [x[i] for i in {1: 2}]\n" * 30_000  # 1.2 MB, on the body thread
    with make_stack(fast_sim(memory_tokens=2_000_000)) as stack:
        body = chat_body(content=code, max_tokens=3, stream=False)
        r = httpx2.post(stack.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert stack.gw.stats()["generations_completed"] == 1
