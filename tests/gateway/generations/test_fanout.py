"""Subscribers that keep up are written to from the relay's read callback (the fan-out); one
that cannot take a write falls back to its own loop and loses nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import orjson
import pytest
from gateway_helpers import chat_body, fast_sim
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsafe.engine_sim import Simulator
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.gateway.generations.fanout import Fanout
from streamsafe.server import ServerThread
from streamsafe.server.asgi import BODY_WRITER_EXTENSION, body_writer
from streamsafe.sse import DONE, SSEDecoder, encode_events


class _Writer:
    """Takes writes until told to decline."""

    def __init__(self, accept: int = 10**9) -> None:
        self.accept = accept
        self.bodies: list[bytes] = []

    def __call__(self, body: bytes) -> bool:
        if self.accept <= 0:
            return False
        self.accept -= 1
        self.bodies.append(body)
        return True


async def _joined(fanout: Fanout, writer: _Writer, cursor: int) -> Any:
    task = asyncio.get_running_loop().create_task(fanout.serve(writer, cursor))
    await asyncio.sleep(0)  # let it join
    assert fanout
    return task


async def test_member_at_the_cursor_gets_each_batch_framed_with_ids_and_moves_on() -> None:
    fanout, writer = Fanout(), _Writer()
    task = await _joined(fanout, writer, 3)
    fanout.publish([b'{"a":1}'], 3, False)
    fanout.publish([b'{"b":2}', b'{"c":3}'], 4, False)
    assert writer.bodies == [
        encode_events([b'{"a":1}'], 3, False),
        encode_events([b'{"b":2}', b'{"c":3}'], 4, False),
    ]
    fanout.release_all()
    assert await task == 6
    assert not fanout


async def test_a_member_whose_writer_declines_is_released_with_its_cursor_unmoved() -> None:
    fanout, writer = Fanout(), _Writer(accept=1)
    task = await _joined(fanout, writer, 0)
    fanout.publish([b"{}"], 0, False)
    fanout.publish([b"{}"], 1, False)  # declined: the loop sends it from the log
    assert await task == 1
    assert not fanout


async def test_a_member_behind_the_published_events_is_released() -> None:
    fanout, writer = Fanout(), _Writer()
    task = await _joined(fanout, writer, 2)
    fanout.publish([b"{}"], 5, False)  # events 2-4 never reached it
    assert await task == 2
    assert writer.bodies == []


async def test_the_events_that_end_the_stream_are_left_to_the_members_loops() -> None:
    # [DONE] comes last: each loop sends it (framed as its route wants) with the end, one write.
    fanout, writer = Fanout(), _Writer()
    task = await _joined(fanout, writer, 0)
    fanout.publish([b'{"x":1}'], 0, False)
    fanout.publish([b'{"y":2}', DONE], 1, False)
    assert writer.bodies == [encode_events([b'{"x":1}'], 0, False)]
    assert await task == 1
    assert not fanout


async def test_cancelled_member_leaves_the_fanout() -> None:
    fanout, writer = Fanout(), _Writer()
    task = await _joined(fanout, writer, 0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not fanout
    fanout.publish([b"{}"], 0, False)
    assert writer.bodies == []


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(st.integers(1, 4), min_size=1, max_size=12),
    accept=st.integers(0, 12),
    multiline=st.booleans(),
)
def test_what_a_member_was_written_is_exactly_the_events_before_its_cursor(
    batches: list[int], accept: int, multiline: bool
) -> None:
    async def run() -> None:
        fanout, writer = Fanout(), _Writer(accept)
        task = await _joined(fanout, writer, 0)
        events: list[bytes] = []
        for size in batches:
            batch = [orjson.dumps({"i": len(events) + j}) for j in range(size)]
            fanout.publish(batch, len(events), multiline)
            events.extend(batch)
        fanout.release_all()
        cursor = await task
        assert cursor == sum(batches[: min(accept, len(batches))])
        decoded = SSEDecoder().feed(b"".join(writer.bodies))
        assert [e.raw for e in decoded] == events[:cursor]
        assert [e.id for e in decoded] == [str(i) for i in range(cursor)]

    asyncio.run(run())


class _Connection:
    """The server side of one in-process request: what went out, in order, through ``send`` and
    through the body writer (which, like the server's, writes only inside a started response,
    and here also declines every ``decline_every``-th write)."""

    def __init__(self, decline_every: int) -> None:
        self.wire = b""
        self.started = self.ended = False
        self.final = b""  # what went out with the end
        self.writes = self.declined = 0
        self._every = decline_every

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            assert message["status"] == 200
            self.started = True
            return
        assert self.started and not self.ended
        self.wire += message.get("body", b"")
        self.ended = not message.get("more_body", False)
        if self.ended:
            self.final = message.get("body", b"")

    def write(self, body: bytes) -> bool:
        if not self.started or self.ended:
            return False
        self.writes += 1
        if self.writes % self._every == 0:
            self.declined += 1
            return False
        self.wire += body
        return True

    async def request(self, gw: Gateway, body: bytes, key: str) -> None:
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # the client stays
            return {"type": "http.disconnect"}

        headers = [(b"content-type", b"application/json"), (b"idempotency-key", key.encode())]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions",
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
            "extensions": {BODY_WRITER_EXTENSION: self.write},
        }
        await asyncio.wait_for(gw(scope, receive, self.send), 30)


@pytest.mark.parametrize("decline_every", [2, 5, 10**9])
async def test_a_subscriber_whose_writes_are_declined_falls_back_and_loses_nothing(
    decline_every: int,
) -> None:
    # A declined write (the client's socket is backed up) hands the subscriber back to its own
    # loop mid-stream; it sends the rest from the log and joins again once caught up. Every
    # event arrives once, in order, byte for byte as a replay of the same generation.
    with ServerThread(Simulator(fast_sim(itl_ms=0.5, default_max_tokens=200))) as sim:
        gw = Gateway(GatewayConfig(upstream=sim.url, heartbeat=0.05))
        await gw.startup()
        try:
            body = orjson.dumps(chat_body("tell me", max_tokens=200))
            live = _Connection(decline_every)
            await live.request(gw, body, "k")
            replay = _Connection(1)  # never written to: all through send
            await replay.request(gw, body, "k")
        finally:
            await gw.shutdown()
    assert live.ended
    assert live.final.endswith(b"data: [DONE]\n\n")  # the last events and the end: one write
    assert live.writes > 50  # the fan-out carried the stream
    assert (live.declined > 0) == (decline_every < 10**9)
    events = SSEDecoder().feed(live.wire)
    assert [e.id for e in events] == [str(i) for i in range(len(events))]
    assert events[-1].raw == DONE
    assert live.wire == replay.wire
    assert gw.stats()["generations_started"] == 1


def test_body_writer_writes_only_inside_a_started_chunked_response() -> None:
    seen: dict[str, list[bool]] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        write = body_writer(scope)
        assert write is not None
        answers = seen.setdefault(scope["method"], [])
        answers.append(write(b"before "))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        answers.append(write(b"written "))
        await send({"type": "http.response.body", "body": b"end", "more_body": False})
        answers.append(write(b"after"))

    with ServerThread(app) as server:
        r = httpx2.get(server.url + "/")
        head = httpx2.head(server.url + "/")
    assert r.content == b"written end"
    assert seen["GET"] == [False, True, False]
    assert head.status_code == 200
    assert seen["HEAD"] == [False, False, False]
