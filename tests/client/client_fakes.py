"""Small ASGI servers with exact fault shapes, a fake clock, and a way to run one scenario
through the sync or the async client alike."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import orjson

from server_stops import stop_later
from streamsafe.client import AsyncClient, Client
from streamsafe.server import ServerThread
from streamsafe.sse import DONE_EVENT, SSEDecoder, encode_comment, encode_event

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
    names: list[str] = field(default_factory=list)  # every header name, repeats kept
    query: str = ""

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
        names = [k.decode().lower() for k, _ in scope["headers"]]
        query = scope.get("query_string", b"").decode()
        seen = Seen(scope["method"], scope["path"], headers, body, names=names, query=query)
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


class _TestServer(ServerThread):
    """A server that, leaving its ``with`` block, stops in the background (see server_stops)."""

    def __exit__(self, *exc: object) -> None:
        stop_later(self)


def serve(app: Any) -> ServerThread:
    server = _TestServer(app)
    # A Cut is a deliberate reset; keep uvicorn's traceback for it out of the test output.
    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)
    return server  # use as `with serve(app) as server:`


def cutting_proxy(
    upstream: str, rng: random.Random, *, share: float = 1.0, events: tuple[int, int] = (1, 5)
) -> FakeServer:
    """A flaky network in front of ``upstream``: it passes requests on and drops ``share`` of
    the response streams (each connection drawn from ``rng``) after a number of SSE events
    drawn from ``events``, as a reset would."""
    client = httpx2.AsyncClient(base_url=upstream, timeout=30)

    async def handler(req: Req) -> None:
        headers = {k: v for k, v in req.headers.items() if k not in ("host", "content-length")}
        cut_at = rng.randint(*events) if rng.random() < share else None
        async with client.stream(
            req.seen.method, req.seen.path, headers=headers, content=req.seen.body
        ) as resp:
            hdrs = [
                (k.encode(), v.encode())
                for k, v in resp.headers.items()
                if k not in ("content-length", "transfer-encoding")
            ]
            await req._send(
                {"type": "http.response.start", "status": resp.status_code, "headers": hdrs}
            )
            decoder = SSEDecoder()
            seen = 0
            async for raw in resp.aiter_raw():
                await req.write(raw)
                seen += len(decoder.feed(raw))
                if cut_at is not None and seen >= cut_at:
                    raise Cut
            await req.write(b"", more=False)

    return FakeServer(handler)


class RefusingPort:
    """A loopback port that refuses every connection for as long as this object holds it: the
    socket is bound (so no other process can take the port) but not listening, so the kernel
    answers a SYN with a reset. :meth:`listen` turns it into a :class:`RawServer` on the very same
    port, so "refused, then up" needs no race for a freed port."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.server: RawServer | None = None

    def listen(self, handler: RawHandler) -> RawServer:
        self.server = RawServer(handler, sock=self.sock)
        return self.server

    def __enter__(self) -> RefusingPort:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.stop()
        else:
            self.sock.close()


RawHandler = Callable[["RawConn"], None]


class RawConn:
    """One accepted connection of a :class:`RawServer`: read the request, answer by hand."""

    def __init__(self, sock: socket.socket, index: int) -> None:
        self.sock = sock
        self.index = index
        self.head = b""
        self.body = b""

    def read_request(self) -> None:
        """Read the request line, headers and a Content-Length body (what httpx2 sends)."""
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = self.sock.recv(65536)
            if not data:
                return
            buf += data
        self.head, _, rest = buf.partition(b"\r\n\r\n")
        length = 0
        for line in self.head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            data = self.sock.recv(65536)
            if not data:
                break
            rest += data
        self.body = rest

    @property
    def headers(self) -> dict[str, str]:
        out = {}
        for line in self.head.decode().split("\r\n")[1:]:
            name, _, value = line.partition(":")
            out[name.strip().lower()] = value.strip()
        return out

    def respond(self, status: int, content_type: str, body: bytes) -> None:
        head = (
            f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.sock.sendall(head.encode() + body)


class RawServer:
    """A loopback TCP server answering each connection by hand in its own thread, for the
    shapes an ASGI server will not produce (a request read and then the socket closed without a
    word). ``conns`` records every connection, in order."""

    def __init__(self, handler: RawHandler, *, sock: socket.socket | None = None) -> None:
        if sock is None:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        self.sock = sock
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.handler = handler
        self.conns: list[RawConn] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.sock.accept()
            except OSError:
                return  # stopped
            conn = RawConn(sock, len(self.conns))
            self.conns.append(conn)
            try:
                self.handler(conn)
            except OSError:
                pass
            finally:
                sock.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(10)

    def __enter__(self) -> RawServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
