"""One gateway in front of several simulator processes (``--upstream`` repeated): routing by
model, load spread, failover before the first token, continuation on another engine when one
dies mid-stream, and fallback models."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from fleet_helpers import Process

from server_stops import stop_later
from streamsafe.engine_sim import expected_text

pytestmark = pytest.mark.timeout(60)

MODEL = "sim-llama-8b"


def chat(content: str, max_tokens: int, model: str = MODEL, stream: bool = True) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def stats(server: Any) -> dict[str, Any]:
    """``/stats`` of a simulator or gateway (a process or an in-process server)."""
    return dict(httpx2.get(server.url + "/stats", timeout=10).json())


def sim(*extra: str) -> Process:
    return Process("simulate", "--itl-ms", "15", "--itl-ms-per-seq", "0", *extra)


def stream_text(url: str, body: dict[str, Any], started: threading.Event | None = None) -> str:
    """The text of a streamed chat answer; sets ``started`` after three content events."""
    parts: list[str] = []
    with httpx2.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            payload = json.loads(line[6:])
            assert "error" not in payload, payload
            parts.append(payload["choices"][0]["delta"].get("content") or "")
            if started is not None and len(parts) == 3:
                started.set()
    return "".join(parts)


@pytest.fixture
def procs() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for proc in reversed(started):
        proc.stop()


def test_engine_killed_mid_stream_every_stream_completes_exactly_on_the_other(
    procs: list[Process],
) -> None:
    a, b = sim(), sim()
    procs += [a, b]
    gw = Process("serve", "--upstream", a.url, "--upstream", b.url)
    procs.append(gw)
    bodies = [chat(f"pool user {i}", 120) for i in range(4)]
    started = [threading.Event() for _ in bodies]
    out: dict[int, Any] = {}

    def run(i: int) -> None:
        try:
            out[i] = stream_text(gw.url, bodies[i], started[i])
        except Exception as exc:  # reported below
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for event in started:
        assert event.wait(30)
    # The pool spread the streams over both engines (least memory in flight first).
    assert stats(a)["active"] >= 1
    a.kill()
    for t in threads:
        t.join(30)
    for i, body in enumerate(bodies):
        assert out[i] == expected_text(body, 120, 0), out[i]
    assert stats(b)["requests_received"] >= 2 + 1  # its own share, and the continuations
    gw_stats = stats(gw)
    assert gw_stats["continued"] >= 1 and gw_stats["engine_migrations"] >= 1
    assert stats(b)["continuations"] >= 1


@contextlib.contextmanager
def servers(*sims: dict[str, Any]) -> Iterator[list[Any]]:
    """In-process simulators (real loopback HTTP servers), stopped after in the background
    (see server_stops)."""
    from streamsafe.engine_sim import Fault, SimConfig, Simulator
    from streamsafe.server import ServerThread

    fast = {"itl_ms": 2.0, "itl_ms_per_seq": 0.0, "prefill_ms_per_token": 0.0}
    started = []
    try:
        for overrides in sims:
            faults = tuple(Fault.parse(f) for f in overrides.pop("faults", ()))
            config = SimConfig(**{**fast, **overrides, "faults": faults})
            started.append(ServerThread(Simulator(config)).start())
        yield started
    finally:
        stop_later(*started)


@contextlib.contextmanager
def gateway(*engines: str, **settings: Any) -> Iterator[Any]:
    """An in-process gateway in front of ``engines``, stopped after in the background."""
    from streamsafe.gateway import Gateway, GatewayConfig
    from streamsafe.server import ServerThread

    first = engines[0].split()[0]
    gw = ServerThread(Gateway(GatewayConfig(upstream=first, engines=engines, **settings))).start()
    try:
        yield gw
    finally:
        stop_later(gw)


def test_an_engine_that_sheds_is_passed_over_while_full_and_its_breaker_stays_closed() -> None:
    # It sheds every request (503, Retry-After 30 s): full, not failing. The first request goes
    # on to the other engine at once (30 s is too long to wait on it), and new work goes there
    # while the full engine asked for (at most 10 s).
    with (
        servers({"faults": ["status:503:1.0:30"]}, {}) as (bad, good),
        gateway(bad.url, good.url, probe_interval=30) as gw,
    ):
        for i in range(6):
            body = chat(f"failover user {i}", 8)
            assert stream_text(gw.url, body) == expected_text(body, 8, 0)
        assert stats(bad)["faults_injected"]["status"] == 1
        assert stats(good)["generations_completed"] == 6
        engines = stats(gw)["engines"]
        assert engines[0]["breaker"] == engines[1]["breaker"] == "closed"
        assert stats(gw)["engine_failovers"] == 1
        # A client error is the caller's answer: passed through with its reason, not retried.
        before = stats(good)["requests_received"]
        bad_body = {"model": MODEL, "messages": "not a list", "stream": False}
        r = httpx2.post(gw.url + "/v1/chat/completions", json=bad_body)
        assert 400 <= r.status_code < 500 and r.json()["error"]["message"]
        assert stats(good)["requests_received"] <= before + 1
        assert stats(gw)["engine_failovers"] == 1


def test_failing_engine_opens_its_breaker_and_traffic_keeps_away() -> None:
    with (
        servers({"faults": ["status:500:1.0"]}, {}) as (bad, good),
        gateway(bad.url, good.url, probe_interval=30) as gw,
    ):
        for i in range(6):
            body = chat(f"failing user {i}", 8)
            assert stream_text(gw.url, body) == expected_text(body, 8, 0)
        # Three straight 500s opened the bad engine's breaker: after them nothing more went
        # there. The first request tried it twice (a 500 is worth one more try), the second once.
        assert stats(bad)["faults_injected"]["status"] == 3
        assert stats(good)["generations_completed"] == 6
        engines = stats(gw)["engines"]
        assert engines[0]["breaker"] == "open" and engines[1]["breaker"] == "closed"
        assert stats(gw)["engine_failovers"] == 2
        assert stats(gw)["breaker_open"] == 1


def test_a_429_with_retry_after_goes_to_the_other_engine_then_waits_at_the_gate() -> None:
    # A pool that sheds everything is full: the generation waits for room at the engine's
    # refusal gate up to the queue timeout (docs/design.md, Commit); one shorter than the
    # engine's Retry-After ends the wait at the first shed of each engine. A shed is never asked
    # again of the same engine by the failover: the gate's schedule alone asks again.
    with (
        servers({"faults": ["status:429:1.0:1"]}) as (only,),
        gateway(only.url, only.url + "/", queue_timeout=0.5) as gw,
    ):
        r = httpx2.post(gw.url + "/v1/chat/completions", json=chat("shed", 4, stream=False))
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.headers["x-should-retry"] == "false"
        assert r.json()["error"]
        assert stats(only)["faults_injected"]["status"] == 2  # each engine of the pool once


def test_fallback_model_answers_when_its_engines_are_down_and_says_so() -> None:
    with (
        servers({"model": "small"}, {"model": "big"}) as (small, big),
        gateway(
            f"{small.url} models=small", f"{big.url} models=big", fallback_models=("small=big",)
        ) as gw,
    ):
        models = httpx2.get(gw.url + "/v1/models").json()
        assert sorted(m["id"] for m in models["data"]) == ["big", "small"]
        url = gw.url + "/v1/chat/completions"
        first = httpx2.post(url, json=chat("q", 4, "small", False))
        assert first.json()["model"] == "small"
        small.stop()  # the only engine of "small" is gone
        second = httpx2.post(url, json=chat("q", 4, "small", False))
        assert second.status_code == 200
        assert second.json()["model"] == "big"  # the model that answered
        unknown = httpx2.post(url, json=chat("q", 4, "gpt-9", False))
        assert unknown.status_code == 404
        assert unknown.json()["error"]["type"] == "not_found_error"


def test_bench_fleet_small_run_completes_every_stream_exactly() -> None:
    from streamsafe_bench.fleet import FleetSettings, run

    report = run(FleetSettings(replicas=2, engines=2, requests=12, window_s=1.5, max_tokens=30))
    assert report["completed"] == report["logical_requests"] == 12
    assert report["amplification"] == 1.0
    assert report["tokens_lost"] == report["tokens_repeated"] == 0
    assert report["errors"] == []


@pytest.mark.parametrize(
    "fault",
    [
        "status:503:1.0",
        "status:429:1.0:1",
        "status:500:1.0#1",
        "reset:1.0",
        "hang:0:1.0",
        "stall:5:1.0",
        "cut:0:1.0",
        "cut:3:1.0",
        "hang:3:1.0",
        "malformed:3:1.0",
        "nodone:1.0",
    ],
)
def test_every_fault_of_the_primary_is_answered_completely_by_the_pool(fault: str) -> None:
    """The engine of model ``m`` fails (before its first token, or mid-stream; a stall or a
    silence past the gateway's timeouts counts as a cut); model ``m-big`` is its configured
    fallback, on a healthy engine: the caller gets the whole answer."""
    with (
        servers({"model": "m", "faults": [fault]}, {"model": "m-big"}) as (a, b),
        gateway(
            f"{a.url} models=m",
            f"{b.url} models=m-big",
            fallback_models=("m=m-big",),
            first_token_timeout=1.0,
            idle_timeout=0.5,
        ) as gw,
    ):
        body = chat(f"fault {fault}", 12, model="m")
        models: set[str] = set()
        parts: list[str] = []
        with httpx2.stream("POST", gw.url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    payload = json.loads(line[6:])
                    assert "error" not in payload, payload
                    models.add(payload["model"])
                    parts.append(payload["choices"][0]["delta"].get("content") or "")
        assert "".join(parts) == expected_text(body, 12, 0)
        if fault in ("status:500:1.0#1", "nodone:1.0") or fault.endswith(":3:1.0"):
            # Tried once more on the same engine; only [DONE] was missing; or the stream broke
            # after its first token: continued in the model that began it, never stitched from
            # two models (its only engine is alive, so on that one).
            assert models == {"m"}
        else:  # nothing came before the fault: the fallback answered all of it
            assert models == {"m-big"}


def test_an_engine_holds_no_more_than_its_memory_and_the_rest_wait() -> None:
    slow = {"itl_ms": 10.0}
    # Each request holds about 30 + its prompt tokens: one at a time per engine.
    with (
        servers(dict(slow), dict(slow)) as (a, b),
        gateway(f"{a.url} memory=60", f"{b.url} memory=60") as gw,
    ):
        bodies = [chat(f"room {i}", 30) for i in range(4)]
        out: dict[int, str] = {}
        threads = [
            threading.Thread(target=lambda i=i: out.update({i: stream_text(gw.url, bodies[i])}))
            for i in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for i, body in enumerate(bodies):
            assert out[i] == expected_text(body, 30, 0)
        assert stats(a)["peak_active"] == 1 and stats(b)["peak_active"] == 1
        assert stats(a)["generations_completed"] == stats(b)["generations_completed"] == 2
