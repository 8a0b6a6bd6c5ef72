"""The simulator as a plain ASGI app: vLLM's OpenAI endpoints over :class:`Engine`.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (streaming and not),
``GET /v1/models``, ``GET /health`` (503 once dead), ``GET /metrics`` (Prometheus text with vLLM's
names), ``GET /stats`` (JSON counters), ``POST /admin/restart``.

Every completion request gets a watcher task that reads ASGI ``receive()`` until
``http.disconnect``, so a client that vanishes is noticed wherever its request is: stalled, queued,
prefilling or streaming.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from streamsafe._asgi import (
    BodyTooLarge,
    Disconnected,
    Message,
    Receive,
    Scope,
    Send,
    read_body,
    reset_connection,
    respond,
    serve_lifespan,
)
from streamsafe.engine_sim.config import SimConfig
from streamsafe.engine_sim.engine import Engine, EngineDeadError, Generation, GenState
from streamsafe.engine_sim.faults import Drawn, FaultDraw, StreamCut
from streamsafe.engine_sim.text import TextStream, split_continuation
from streamsafe.engine_sim.validation import BadRequest, Job, validate
from streamsafe.engine_sim.wire import DONE_EVENT, ChunkEncoder, error_body, error_event

__all__ = ["Simulator"]

_SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
#: The malformed fault's event: a chunk cut off in the middle of its JSON.
_MALFORMED_EVENT = b'data: {"id":"chatcmpl-broken","object":"chat.completion.chunk","choi\n\n'


def _tokens_in(parts: list[bytes]) -> int:
    """Token events among ``parts`` (neither the role event nor a malformed one)."""
    return sum(1 for p in parts if b'"delta":{"role"' not in p and p != _MALFORMED_EVENT)


_METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


class _Client:
    """The disconnect watcher's view of one request."""

    __slots__ = ("gen", "gone", "gone_event")

    def __init__(self) -> None:
        self.gen: Generation | None = None
        self.gone = False
        self.gone_event = asyncio.Event()


class Simulator:
    """An OpenAI-compatible server that behaves like vLLM under load (see docs/simulator.md).

    An ASGI app: ASGI lifespan starts and stops its engine task (and the first request starts it
    if the server has no lifespan). ``stats()``, ``memory_series()`` and ``restart()`` are safe
    from any thread.
    """

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.engine = Engine(self.config)
        self._faults = FaultDraw(self.config)
        self._routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/stats"): self._stats,
            ("POST", "/admin/restart"): self._restart,
        }

    # -- the public surface ------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The ``/stats`` counters (each key is explained in docs/simulator.md)."""
        return self.engine.stats()

    def memory_series(self) -> list[tuple[float, int]]:
        """(seconds since start, tokens of memory in use), bounded, for plots."""
        return self.engine.memory_series()

    def restart(self) -> None:
        """Revive the engine (as ``POST /admin/restart``): from any thread."""
        loop = self.engine.loop
        if loop is None or loop.is_closed() or not self.engine.started:
            self.engine.restart()
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self.engine.restart()
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def _do() -> None:
            try:
                self.engine.restart()
                done.set_result(None)
            except BaseException as exc:  # handed to the caller
                done.set_exception(exc)

        loop.call_soon_threadsafe(_do)
        done.result(timeout=10)

    # -- ASGI --------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if not self.engine.started:
                self.engine.start()
            path = scope["path"]
            if path.startswith(_LLAMA_STACK_PREFIX):
                # Llama Stack's OpenAI-compatible paths, so the simulator can stand for the
                # Llama Stack + vLLM deployment of the original report (llama-stack-client 0.2.x
                # posts there). Llama Stack ends its streams without ``data: [DONE]``.
                path = path[len("/v1/openai") :]
                scope = dict(scope, path=path)
                send = _without_done(send)
            route = self._routes.get((scope["method"], path))
            if route is None:
                known = any(path == scope["path"] for _, path in self._routes)
                code = 405 if known else 404
                msg = "Method Not Allowed" if known else f"Not Found: {scope['path']}"
                await respond(send, code, error_body(msg, code))
                return
            await route(scope, receive, send)
        elif kind == "lifespan":
            await serve_lifespan(receive, send, self._startup, self.engine.stop)

    async def _startup(self) -> None:
        self.engine.start()

    # -- small routes ------------------------------------------------------------------------

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        cfg = self.config
        body = {
            "object": "list",
            "data": [
                {
                    "id": cfg.model,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm",
                    "root": cfg.model,
                    "parent": None,
                    "max_model_len": cfg.memory_tokens,
                }
            ],
        }
        await respond(send, 200, orjson.dumps(body))

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.engine.dead:
            await respond(send, 503, error_body(self.engine.dead_message, 503))
        else:
            await respond(send, 200, b"", content_type=None)

    async def _stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, orjson.dumps(self.stats()))

    async def _restart(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.engine.restart()
        stats = self.stats()
        body = {"restarted": True, "crashes": stats["crashes"], "restarts": stats["restarts"]}
        await respond(send, 200, orjson.dumps(body))

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        from streamsafe.engine_sim.metrics import render_metrics

        text = render_metrics(self.config.model, self.stats())
        await respond(send, 200, text.encode(), content_type=_METRICS_TYPE)

    # -- completions -------------------------------------------------------------------------

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._complete(scope, receive, send, chat=True)

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._complete(scope, receive, send, chat=False)

    async def _complete(self, scope: Scope, receive: Receive, send: Send, chat: bool) -> None:
        engine = self.engine
        try:
            raw = await read_body(receive, self.config.max_body_bytes)
        except BodyTooLarge:
            engine.count("requests_received")
            await respond(send, 413, error_body("request body too large", 413))
            return
        except Disconnected:
            raw = b""  # refused below as malformed; nobody reads the answer
        engine.count("requests_received")
        try:
            job = validate(orjson.loads(raw), chat, self.config)
            continuation = split_continuation(job.body) is not None
            faults = self._faults.draw(scope.get("headers", ()), continuation)
        except orjson.JSONDecodeError as exc:
            await respond(send, 400, error_body(f"malformed JSON body: {exc}", 400))
            return
        except BadRequest as exc:
            await respond(send, exc.code, error_body(str(exc), exc.code))
            return
        except ValueError as exc:  # a bad x-sim-fault header
            await respond(send, 400, error_body(str(exc), 400))
            return
        if engine.dead:
            await respond(send, 500, error_body(engine.dead_message, 500))
            return
        if faults.reset:
            engine.count("faults_reset")
            reset = reset_connection(scope)
            if reset is None:
                raise StreamCut("injected fault: reset (this server cannot reset; closing)")
            reset()
            return
        if faults.status is not None:
            engine.count("faults_status")
            fault = faults.status
            headers = []
            if fault.retry_after is not None and fault.status in (429, 503):
                headers.append((b"retry-after", f"{fault.retry_after:g}".encode()))
            msg = f"injected fault: status {fault.status}"
            await respond(send, fault.status, error_body(msg, fault.status), headers=headers)
            return

        client = _Client()
        watcher = asyncio.create_task(self._watch(receive, client))
        try:
            if job.stream:
                await self._stream(send, job, faults, client)
            else:
                await self._unary(send, job, faults, client)
        finally:
            watcher.cancel()

    async def _watch(self, receive: Receive, client: _Client) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
        client.gone = True
        client.gone_event.set()
        if client.gen is not None:
            self.engine.client_gone(client.gen)

    async def _stall(self, faults: Drawn, client: _Client) -> None:
        if faults.stall_s > 0:
            self.engine.count("faults_stall")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(client.gone_event.wait(), faults.stall_s)

    def _encoder(self, job: Job) -> ChunkEncoder:
        prefix = "chatcmpl-" if job.chat else "cmpl-"
        return ChunkEncoder(
            chat=job.chat,
            request_id=prefix + uuid.uuid4().hex,
            created=int(time.time()),
            model=self.config.model,
        )

    def _admit(self, job: Job, client: _Client) -> Generation:
        gen = self.engine.submit(
            job.prompt_tokens,
            job.max_tokens,
            continuation=job.body.get("continue_final_message") is True,
        )
        client.gen = gen
        if client.gone:  # vanished between the watcher's check and admission
            self.engine.client_gone(gen)
        return gen

    async def _unary(self, send: Send, job: Job, faults: Drawn, client: _Client) -> None:
        await self._stall(faults, client)
        if client.gone:
            return
        try:
            gen = self._admit(job, client)
        except EngineDeadError as exc:
            await respond(send, 500, error_body(str(exc), 500))
            return
        await gen.wait_end()
        if gen.state == GenState.FAILED:
            if not client.gone:
                await respond(send, 500, error_body(gen.error, 500))
            return
        if gen.state != GenState.DONE or client.gone:
            return
        text = TextStream(job.body, self.config.seed).text(gen.generated)
        body = self._encoder(job).complete(text, job.prompt_tokens, gen.generated)
        await respond(send, 200, body)
        gen.sent = gen.generated

    async def _stream(self, send: Send, job: Job, faults: Drawn, client: _Client) -> None:
        cfg = self.config
        started = False
        if not cfg.headers_after_first_token:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE})
            started = True
        await self._stall(faults, client)
        if client.gone:
            return
        try:
            gen = self._admit(job, client)
        except EngineDeadError as exc:
            if started:
                await _finish(send, error_event(str(exc)) + DONE_EVENT)
            else:
                await respond(send, 500, error_body(str(exc), 500))
            return
        enc = self._encoder(job)
        text = TextStream(job.body, cfg.seed)
        last_index = gen.max_tokens - 1
        budget = faults.cut_after  # data events left before a cut
        events_out = 0  # data events sent (for the hang and malformed faults)
        role_pending = job.chat
        while True:
            await gen.wait()
            state = gen.state
            if client.gone or state == GenState.ABORTED:
                return
            n = gen.generated
            parts: list[bytes] = []
            if n > gen.sent and role_pending:
                parts.append(enc.role())
                role_pending = False
            for i in range(gen.sent, n):
                parts.append(enc.token(text.token(i), i == last_index))
            end: bytes | None = None
            if state == GenState.DONE:
                end = (enc.usage(job.prompt_tokens, n) if job.include_usage else b"") + DONE_EVENT
                parts.append(end)
            elif state == GenState.FAILED:
                end = error_event(gen.error) + DONE_EVENT
                if not started and not parts:
                    await respond(send, 500, error_body(gen.error, 500))
                    return
                parts.append(end)
            if end is not None and faults.nodone and end.endswith(DONE_EVENT):
                self.engine.count("faults_nodone")
                parts[-1] = end = end[: -len(DONE_EVENT)]
            if faults.malformed_after is not None:
                at = faults.malformed_after - events_out
                if 0 <= at <= len(parts) - (end is not None):
                    self.engine.count("faults_malformed")
                    parts.insert(at, _MALFORMED_EVENT)
                    faults.malformed_after = None
            if faults.hang_after is not None:
                at = faults.hang_after - events_out
                if at < len(parts) - (end is not None) or end is not None:
                    await self._hang(send, gen, parts[: max(0, at)], n, started, client)
                    return
            events_out += len(parts)
            if budget is not None and len(parts) - (end is not None) >= budget:
                await self._cut(send, gen, parts[:budget], n, started)
                return
            if budget is not None:
                budget -= len(parts) - (end is not None)
            if not started:
                await send({"type": "http.response.start", "status": 200, "headers": _SSE})
                started = True
            if end is not None:
                await _finish(send, b"".join(parts))
                gen.sent = n
                return
            await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
            gen.sent = n

    async def _hang(
        self,
        send: Send,
        gen: Generation,
        parts: list[bytes],
        n: int,
        started: bool,
        client: _Client,
    ) -> None:
        """Send ``parts``, then nothing more with the connection open, as a frozen engine does;
        the request is dropped once the client leaves."""
        self.engine.count("faults_hang")
        await _send_last(send, gen, parts, n, started)
        await client.gone_event.wait()
        self.engine.client_gone(gen)

    async def _cut(
        self, send: Send, gen: Generation, parts: list[bytes], n: int, started: bool
    ) -> None:
        self.engine.count("faults_cut")
        await _send_last(send, gen, parts, n, started)
        self.engine.client_gone(gen)
        raise StreamCut("injected fault: connection cut")


async def _send_last(
    send: Send, gen: Generation, parts: list[bytes], n: int, started: bool
) -> None:
    """Send ``parts``, the last a faulty stream sends, and note the tokens among them as sent."""
    if not started:
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
    if parts:
        await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
    gen.sent = min(n, gen.sent + _tokens_in(parts))


_LLAMA_STACK_PREFIX = "/v1/openai/v1/"


def _without_done(send: Send) -> Send:
    """``send`` that drops the ``data: [DONE]`` event, as Llama Stack's stream does not send it."""

    async def wrapped(message: Message) -> None:
        body = message.get("body")
        if body and body.endswith(DONE_EVENT):
            message = dict(message, body=body[: -len(DONE_EVENT)])
        await send(message)

    return wrapped


async def _finish(send: Send, body: bytes) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": False})
