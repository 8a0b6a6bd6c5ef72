"""The simulator as a plain ASGI app: vLLM's OpenAI endpoints over :class:`Engine`.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/messages``
(Anthropic's, see :mod:`~streamsafe.engine_sim.messages`; streaming and not),
``POST /v1/messages/count_tokens``, ``POST /tokenize``, ``POST /v1/embeddings``,
``POST /v1/audio/transcriptions`` (a form read as it comes), ``GET /v1/models``, ``GET /version``,
``GET /is_sleeping``, ``GET /health`` (503 once dead), ``GET /metrics`` (Prometheus text with
vLLM's names), ``GET /stats`` (JSON counters), ``POST /admin/restart``.

A completion request is read, counted, validated and checked for the faults that refuse it
outright (an outage of the whole engine, a status, a reset, no answer) here;
:class:`~streamsafe.engine_sim.completion.Completion` answers the rest. The other routes are
:class:`~streamsafe.engine_sim.other_routes.OtherRoutes`'.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from streamsafe.engine_sim.completion import Completion
from streamsafe.engine_sim.config import SimConfig
from streamsafe.engine_sim.engine import Engine
from streamsafe.engine_sim.faults import Drawn, FaultDraw, StreamCut
from streamsafe.engine_sim.messages import MessagesWriter, to_chat
from streamsafe.engine_sim.other_routes import OtherRoutes
from streamsafe.engine_sim.outage import Outage, Outages
from streamsafe.engine_sim.refusals import refuse, refuse_in_stream
from streamsafe.engine_sim.text import split_continuation
from streamsafe.engine_sim.validation import (
    INVALID_PREFILL,
    BadRequest,
    ContextTooLong,
    Job,
    validate,
)
from streamsafe.engine_sim.wire import DONE_EVENT, error_body
from streamsafe.server.asgi import (
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

__all__ = ["Simulator"]


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
        self._outages = Outages(self.config, self.engine)
        other = OtherRoutes(self.config, self.engine)
        self._routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/messages"): self._messages,
            ("POST", "/v1/messages/count_tokens"): other.count_tokens,
            ("POST", "/tokenize"): other.tokenize,
            ("POST", "/v1/embeddings"): other.embeddings,
            ("POST", "/v1/audio/transcriptions"): other.transcription,
            ("GET", "/version"): other.version,
            ("GET", "/is_sleeping"): other.is_sleeping,
            ("GET", "/v1/models"): other.models,
            ("GET", "/health"): other.health,
            ("GET", "/metrics"): other.metrics,
            ("GET", "/stats"): other.stats,
            ("POST", "/admin/restart"): other.restart,
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
            # An outage meets every request but those to /stats (a test reads it) and the
            # completions (counted first, by the model they name, in _complete).
            if path != "/stats" and (route is None or path not in _COMPLETIONS):
                outage = self._outages.now()
                if outage is not None:
                    await self._outages.meet(outage, scope, receive, send)
                    return
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

    # -- completions -------------------------------------------------------------------------

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._complete(scope, receive, send, chat=True)

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._complete(scope, receive, send, chat=False)

    async def _messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._complete(scope, receive, send, chat=True, messages=True)

    async def _complete(
        self, scope: Scope, receive: Receive, send: Send, chat: bool, messages: bool = False
    ) -> None:
        engine = self.engine
        # Anthropic's API is answered from the chat it stands for, in its own shapes.
        writer = MessagesWriter(send, 0) if messages else None
        if writer is not None:
            send = writer.send
        try:
            raw = await read_body(receive, self.config.max_body_bytes)
        except BodyTooLarge as exc:
            engine.count("requests_received")
            await refuse(send, exc)
            return
        except Disconnected:
            raw = b""  # refused below as malformed; nobody reads the answer
        engine.count("requests_received")
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            body = exc
        if isinstance(body, dict):
            model = body.get("model", self.config.model)
            engine.count_model(model if isinstance(model, str) else repr(model))
        if (outage := self._outages.now()) is not None:
            await self._outages.meet(outage, scope, receive, send)
            return
        try:
            if isinstance(body, orjson.JSONDecodeError):
                raise body
            if writer is not None:
                body = to_chat(body)
            job = validate(body, chat, self.config)
            if writer is not None:
                writer.prompt_tokens = job.prompt_tokens
            continuation = split_continuation(job.body) is not None
            faults = self._faults.draw(scope.get("headers", ()), continuation)
        except (BadRequest, ValueError) as exc:  # ValueError: bad JSON, a bad x-sim-fault header
            if isinstance(exc, ContextTooLong):
                engine.count("refused_context_length")
            elif isinstance(exc, BadRequest) and exc.name == INVALID_PREFILL:
                engine.count("refused_prefill")
            await refuse(send, exc)
            return
        if await self._answered_before_work(faults, job, scope, receive, send):
            return
        await Completion(engine, self.config, job, faults).serve(receive, send)

    async def _answered_before_work(
        self, faults: Drawn, job: Job, scope: Scope, receive: Receive, send: Send
    ) -> bool:
        """Answer a valid request the way a failing engine would before any work (an injected
        black hole, reset, status or error event, or the engine dead); whether it did."""
        engine = self.engine
        if faults.black_hole:
            await self._outages.meet(Outage("silent"), scope, receive, send)
            return True
        if engine.dead:
            await respond(send, 500, error_body(engine.dead_message, 500))
            return True
        if faults.reset:
            engine.count("faults_reset")
            reset = reset_connection(scope)
            if reset is None:
                raise StreamCut("injected fault: reset (this server cannot reset; closing)")
            reset()
            return True
        if faults.status is not None:
            engine.count("faults_status")
            fault = faults.status
            headers = []
            if fault.retry_after is not None and fault.status in (429, 503):
                headers.append((b"retry-after", f"{fault.retry_after:g}".encode()))
            msg = f"injected fault: status {fault.status}"
            await respond(send, fault.status, error_body(msg, fault.status), headers=headers)
            return True
        if faults.error_event is not None:
            engine.count("faults_errorevent")
            await refuse_in_stream(send, faults.error_event.status, job.stream)
            return True
        return False


_LLAMA_STACK_PREFIX = "/v1/openai/v1/"
_COMPLETIONS = frozenset(("/v1/chat/completions", "/v1/completions", "/v1/messages"))


def _without_done(send: Send) -> Send:
    """``send`` that drops the ``data: [DONE]`` event, as Llama Stack's stream does not send it."""

    async def wrapped(message: Message) -> None:
        body = message.get("body")
        if body and body.endswith(DONE_EVENT):
            message = dict(message, body=body[: -len(DONE_EVENT)])
        await send(message)

    return wrapped
