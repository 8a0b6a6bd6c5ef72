"""Small ASGI servers with exact fault shapes, a fake clock, and a way to run one scenario
through the sync or the async client alike."""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from streamsafe.client import AsyncClient, Client
from streamsafe.serving import ServerThread
from streamsafe.sse import DONE_EVENT, encode_comment, encode_event

NOW = 1_700_000_000.0


class FakeClock:
    """Time that moves only when the client sleeps: retries wait no real time."""

    def __init__(self) -> None:
        self.now = NOW
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


@dataclass
class Seen:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    disconnected: threading.Event = field(default_factory=threading.Event)

    def json(self) -> Any:
        return orjson.loads(self.body)


Handler = Callable[["Req"], Awaitable[None]]


class Req:
    """What a handler gets: the request, and ways to answer it."""

    def __init__(self, seen: Seen, index: int, receive: Any, send: Any) -> None:
        self.seen = seen
        self.index = index  # 0 for the first request this server got
        self._receive = receive
        self._send = send

    @property
    def headers(self) -> dict[str, str]:
        return self.seen.headers

    async def status(
        self, code: int, body: Any = None, headers: dict[str, str] | None = None
    ) -> None:
        payload = orjson.dumps(
            body
            if body is not None
            else {"error": {"message": f"fake {code}", "type": "fake", "code": code}}
        )
        hdrs = [(b"content-type", b"application/json")]
        hdrs += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        await self._send({"type": "http.response.start", "status": code, "headers": hdrs})
        await self._send({"type": "http.response.body", "body": payload})

    async def start_stream(self, *, resumable: bool = False) -> None:
        hdrs = [(b"content-type", b"text/event-stream")]
        if resumable:
            hdrs.append((b"x-stream-resumable", b"true"))
        await self._send({"type": "http.response.start", "status": 200, "headers": hdrs})

    async def write(self, data: bytes, more: bool = True) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": more})

    async def wait_disconnect(self) -> None:
        """Hold until the client goes away (recorded on ``seen.disconnected``)."""
        while True:
            msg = await self._receive()
            if msg["type"] == "http.disconnect":
                self.seen.disconnected.set()
                return


class Cut(Exception):
    """Raised inside a handler to drop the connection mid-response (a reset)."""


class FakeServer:
    """An ASGI app that records each request and answers with ``handler``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Seen] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        seen = Seen(scope["method"], scope["path"], headers, body)
        index = len(self.requests)
        self.requests.append(seen)
        req = Req(seen, index, receive, send)
        try:
            await self.handler(req)
        except Cut:
            raise
        except (asyncio.CancelledError, OSError):
            seen.disconnected.set()
            raise

    def keys(self) -> list[str | None]:
        return [r.headers.get("idempotency-key") for r in self.requests]


def serve(app: Any) -> ServerThread:
    server = ServerThread(app)
    # A Cut is a deliberate reset; keep uvicorn's traceback for it out of the test output.
    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)
    return server  # use as `with serve(app) as server:`


def refused_url() -> str:
    """A loopback URL whose port refuses connections (bound, then closed)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/v1"


# -- stream content -------------------------------------------------------------------------


def words(n: int) -> list[str]:
    return [f"w{i} " for i in range(n)]


def chunk(i: int, content: str | None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    return orjson.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "fake",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def events(n: int) -> list[bytes]:
    """n content chunks then a finishing chunk: event i is numbered i (the gateway's way)."""
    out = [chunk(i, w) for i, w in enumerate(words(n))]
    out.append(chunk(n, None, "stop"))
    return out


def completion(text: str = "hello") -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": "fake",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
    }


def resumable_stream(
    n: int,
    *,
    rng: random.Random | None = None,
    cut_every: int | None = None,
    keepalive: bool = False,
) -> Handler:
    """The gateway's contract: ``id: i`` on every event, ``X-Stream-Resumable: true``, and given
    ``Last-Event-ID: k`` replay from k + 1. Each connection is cut (reset or clean end) after a
    random number of events, until the rest fits."""
    evs = events(n)

    async def handler(req: Req) -> None:
        if req.seen.method == "GET":
            await req.status(200, {"object": "list", "data": []})
            return
        last = req.headers.get("last-event-id")
        start = 0 if last is None else int(last) + 1
        await req.start_stream(resumable=True)
        if keepalive:
            await req.write(encode_comment("keep-alive"))
        budget = len(evs) - start + 1
        if rng is not None:
            budget = rng.randint(0, 4)
        elif cut_every is not None:
            budget = cut_every
        for i in range(start, len(evs)):
            if budget <= 0:
                if rng is not None and rng.random() < 0.5:
                    await req.write(b"", more=False)  # clean end before [DONE]
                    return
                # Half an event, then a reset: the partial event must be dropped.
                await req.write(b'id: %d\ndata: {"partial' % i)
                raise Cut
            await req.write(encode_event(evs[i], id=i))
            budget -= 1
        await req.write(DONE_EVENT, more=False)

    return handler


def plain_stream(n: int, *, cut_after: int | None = None, clean: bool = False) -> Handler:
    """A stream without ids or resume (vLLM's shape), optionally cut after ``cut_after``."""
    evs = events(n)

    async def handler(req: Req) -> None:
        await req.start_stream()
        for i, ev in enumerate(evs):
            if cut_after is not None and i == cut_after:
                if clean:
                    await req.write(b"", more=False)
                    return
                raise Cut
            await req.write(encode_event(ev))
        await req.write(DONE_EVENT, more=False)

    return handler


# -- one scenario through either client -----------------------------------------------------


@dataclass
class Result:
    value: Any = None
    chunks: list[Any] = field(default_factory=list)
    text: str = ""
    error: BaseException | None = None
    key: str | None = None


def run(
    mode: str,
    client_kw: dict[str, Any],
    *,
    kind: str = "chat",
    stream: bool = True,
    clock: FakeClock | None = None,
    calls: int = 1,
    **create_kw: Any,
) -> list[Result]:
    """Make ``calls`` calls with a sync or async client; each gives a Result (errors caught)."""
    clock = clock or FakeClock()
    kw = dict(client_kw)
    kw.setdefault("clock", clock.time)
    kw.setdefault("rand", lambda: 0.5)

    def args() -> dict[str, Any]:
        a: dict[str, Any] = {"model": "fake", "stream": stream, **create_kw}
        if kind == "chat":
            a.setdefault("messages", [{"role": "user", "content": "hi"}])
        elif kind == "completion":
            a.setdefault("prompt", "hi")
        return a

    if mode == "sync":
        out = []
        with Client(sleep=clock.sleep, **kw) as client:
            for _ in range(calls):
                res = Result()
                try:
                    if kind == "models":
                        res.value = client.models.list()
                    else:
                        api = client.chat.completions if kind == "chat" else client.completions
                        value = api.create(**args())
                        if stream:
                            with value as s:
                                res.key = s.idempotency_key
                                for c in s:
                                    res.chunks.append(c)
                                res.text = s.text
                        res.value = value
                except Exception as exc:
                    res.error = exc
                out.append(res)
        return out

    async def go() -> list[Result]:
        out = []
        async with AsyncClient(sleep=clock.asleep, **kw) as client:
            for _ in range(calls):
                res = Result()
                try:
                    if kind == "models":
                        res.value = await client.models.list()
                    else:
                        api = client.chat.completions if kind == "chat" else client.completions
                        value = await api.create(**args())
                        if stream:
                            async with value as s:
                                res.key = s.idempotency_key
                                async for c in s:
                                    res.chunks.append(c)
                                res.text = s.text
                        res.value = value
                except Exception as exc:
                    res.error = exc
                out.append(res)
        return out

    return asyncio.run(go())
