"""A Responses-API server in the shape of OGX's (``POST /v1/responses``), for the tests and the
look-up benchmark that need many Responses streams, large or long, without a real OGX and its
engine: typed events with a ``sequence_number`` from 0, ``response.created`` and
``response.in_progress`` at once, output deltas, then ``response.completed``; ``data:`` lines
only and no ``[DONE]`` (OGX's way). Every other request is answered 404 with an OpenAI-style
error, as a server answers for a response it does not hold, and recorded.

A request's ``input`` may say how its answer looks: ``"deltas=N size=B every=S"`` (N deltas of
B bytes each, S seconds apart); the defaults otherwise. The delta text is random (the gateway's
log cannot compress it), so a caller controls what a kept answer costs.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["ResponsesUpstream", "answer_input"]

_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_JSON_HEADERS = [(b"content-type", b"application/json")]


def answer_input(deltas: int, size: int, every: float = 0.0) -> str:
    """The ``input`` that asks :class:`ResponsesUpstream` for ``deltas`` deltas of ``size``
    bytes, ``every`` seconds apart."""
    return f"deltas={deltas} size={size} every={every}"


@dataclass
class ResponsesUpstream:
    """The ASGI app (see the module). ``deltas``, ``size`` and ``every``: an answer's shape
    where its input does not say."""

    deltas: int = 8
    size: int = 8
    every: float = 0.0
    #: Responses started (``POST /v1/responses``).
    started: int = 0
    #: Streams that ended because their caller left before the end.
    aborted: int = 0
    #: ``(method, path)`` of every other request (what the gateway passed through).
    passed: list[tuple[str, str]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        method, path = scope["method"], scope["path"]
        if method == "GET" and path in ("/v1/health", "/v1/version"):
            await _send(send, 200, b'{"status":"OK"}')
        elif method == "GET" and path == "/v1/models":
            await _send(send, 200, b'{"object":"list","data":[]}')
        elif method == "POST" and path == "/v1/responses":
            await self._respond(orjson.loads(body), receive, send)
        else:
            self.passed.append((method, path))
            error = {"message": f"no response at {path}", "type": "not_found", "code": 404}
            await _send(send, 404, orjson.dumps({"error": {**error, "param": None}}))

    async def _respond(self, request: dict[str, Any], receive: Any, send: Any) -> None:
        self.started += 1
        response_id = f"resp_{next(self._ids):06d}{os.urandom(4).hex()}"
        deltas, size, every = self._shape(request.get("input"))
        head = {"id": response_id, "object": "response", "model": request.get("model")}
        if not request.get("stream"):
            text = os.urandom(deltas * size // 2 + 1).hex()[: deltas * size]
            answer = {**head, "status": "completed", "output_text": text}
            await _send(send, 200, orjson.dumps(answer))
            return
        left = asyncio.Event()
        watch = asyncio.ensure_future(_disconnect(receive, left))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            events = [
                {"type": "response.created", "response": {**head, "status": "in_progress"}},
                {"type": "response.in_progress", "response": {**head, "status": "in_progress"}},
            ]
            for seq, event in enumerate(events):
                await _event(send, {**event, "sequence_number": seq})
            for i in range(deltas):
                if every and await _left_within(left, every):
                    self.aborted += 1
                    return
                delta = os.urandom(size // 2 + 1).hex()[:size]
                delta_event: dict[str, Any] = {
                    "type": "response.output_text.delta",
                    "sequence_number": i + 2,
                    "item_id": "msg_" + response_id,
                    "output_index": 0,
                    "content_index": 0,
                    "delta": delta,
                }
                await _event(send, delta_event)
            done = {"type": "response.completed", "sequence_number": deltas + 2}
            await _event(send, {**done, "response": {**head, "status": "completed"}})
            await send({"type": "http.response.body", "body": b""})
        finally:
            watch.cancel()

    def _shape(self, given: object) -> tuple[int, int, float]:
        deltas, size, every = self.deltas, self.size, self.every
        if isinstance(given, str) and given.startswith("deltas="):
            fields = dict(part.split("=", 1) for part in given.split())
            deltas, size = int(fields["deltas"]), int(fields["size"])
            every = float(fields.get("every", every))
        return deltas, size, every


async def _send(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": _JSON_HEADERS})
    await send({"type": "http.response.body", "body": body})


async def _event(send: Any, event: dict[str, Any]) -> None:
    data = b"data: " + orjson.dumps(event) + b"\n\n"
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def _disconnect(receive: Any, left: asyncio.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    left.set()


async def _left_within(left: asyncio.Event, seconds: float) -> bool:
    """Whether the caller left within ``seconds`` (the pause between two deltas)."""
    try:
        await asyncio.wait_for(left.wait(), seconds)
    except TimeoutError:
        return False
    return True
