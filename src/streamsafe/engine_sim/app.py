"""The simulator as a plain ASGI app: vLLM's OpenAI endpoints over :class:`Engine`.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/messages``
(Anthropic's, see :mod:`~streamsafe.engine_sim.messages`; streaming and not),
``POST /v1/messages/count_tokens``, ``POST /tokenize``, ``POST /v1/embeddings``,
``POST /v1/audio/transcriptions`` (a form read as it comes), ``GET /v1/models``, ``GET /version``,
``GET /is_sleeping``, ``GET /health`` (503 once dead), ``GET /metrics`` (Prometheus text with
vLLM's names), ``GET /stats`` (JSON counters), ``POST /admin/restart``.

A completion request is read, counted, validated and checked for the faults that refuse it
outright (an outage of the whole engine, a status, a reset, no answer) here;
:class:`~streamsafe.engine_sim.completion.Completion` answers the rest.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import orjson

from streamsafe.engine_sim.completion import Completion
from streamsafe.engine_sim.config import SimConfig
from streamsafe.engine_sim.engine import Engine
from streamsafe.engine_sim.faults import Drawn, FaultDraw, StreamCut
from streamsafe.engine_sim.messages import MessagesWriter, count_tokens_body, to_chat
from streamsafe.engine_sim.outage import Outage, Outages
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
from streamsafe.tokens import estimate_input_tokens, estimate_prompt_tokens

__all__ = ["Simulator"]

_METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


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
        self._routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/messages"): self._messages,
            ("POST", "/v1/messages/count_tokens"): self._count_tokens,
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/v1/embeddings"): self._embeddings,
            ("POST", "/v1/audio/transcriptions"): self._transcription,
            ("GET", "/version"): self._version,
            ("GET", "/is_sleeping"): self._is_sleeping,
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
                    "max_model_len": cfg.max_model_len or cfg.memory_tokens,
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

        cfg = self.config
        kv_tokens = cfg.memory_tokens if cfg.publish_kv_cache else None
        text = render_metrics(cfg.model, self.stats(), kv_tokens)
        await respond(send, 200, text.encode(), content_type=_METRICS_TYPE)

    async def _version(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, b'{"version":"streamsafe-sim"}')

    async def _is_sleeping(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's dev-mode ``GET /is_sleeping`` (an operator route: the simulator never
        sleeps)."""
        await respond(send, 200, b'{"is_sleeping":false}')

    # -- pooling and audio -------------------------------------------------------------------

    async def _embeddings(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's ``POST /v1/embeddings`` in its shape: one vector per input, a function of
        the input's text (equal inputs, equal vectors), ``usage`` counted as the gateway's
        admission counts it."""
        try:
            body = orjson.loads(await read_body(receive, self.config.max_body_bytes))
            if not isinstance(body, dict) or body.get("model", self.config.model) != (
                self.config.model
            ):
                raise BadRequest(f"The model `{_model_named(body)}` does not exist.", 404)
            given = body.get("input")
            inputs = given if isinstance(given, list) and given else [given]
            if not all(isinstance(i, str) for i in inputs):
                raise BadRequest("'input' must be a string or a list of strings")
        except Disconnected:
            return
        except (BodyTooLarge, orjson.JSONDecodeError, BadRequest) as exc:
            await _refuse(send, exc)
            return
        self.engine.count("embeddings")
        tokens = estimate_input_tokens({"input": inputs})
        data = [
            {"index": i, "object": "embedding", "embedding": _vector(text)}
            for i, text in enumerate(inputs)
        ]
        answer = {
            "id": f"embd-{self.engine.stats()['embeddings']}",
            "object": "list",
            "created": int(time.time()),
            "model": self.config.model,
            "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
        }
        await respond(send, 200, orjson.dumps(answer))

    async def _transcription(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's ``POST /v1/audio/transcriptions``: a multipart form read as it comes (each
        chunk counted in ``form_bytes_received`` on arrival, so a test sees whether a gateway
        streams it), answered ``{"text"}`` naming its size."""
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            self.engine.count("form_bytes_received", len(chunk))
            if not message.get("more_body", False):
                break
        await respond(send, 200, orjson.dumps({"text": f"{size} bytes of form"}))

    # -- completions -------------------------------------------------------------------------

    async def _tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's ``POST /tokenize``: a chat (``messages``) or completion (``prompt``) request's
        prompt tokens, counted as a completion of it would count them (its ``usage``)."""
        try:
            body = orjson.loads(await read_body(receive, self.config.max_body_bytes))
            if not isinstance(body, dict) or not (
                isinstance(body.get("messages"), list) or isinstance(body.get("prompt"), str)
            ):
                raise BadRequest("give 'messages' (a list) or 'prompt' (a string)")
            count = estimate_prompt_tokens(body)
        except Disconnected:
            return
        except (BodyTooLarge, orjson.JSONDecodeError, BadRequest) as exc:
            await _refuse(send, exc)
            return
        answer = {
            "count": count,
            "max_model_len": self.config.max_model_len or self.config.memory_tokens,
            "tokens": list(range(count)),
            "token_strs": None,
        }
        await respond(send, 200, orjson.dumps(answer))

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._complete(scope, receive, send, chat=True)

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._complete(scope, receive, send, chat=False)

    async def _messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._complete(scope, receive, send, chat=True, messages=True)

    async def _count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/messages/count_tokens``: the prompt's tokens, as the chat counts them."""
        try:
            chat = to_chat(
                orjson.loads(await read_body(receive, self.config.max_body_bytes)), count_only=True
            )
        except (BadRequest, orjson.JSONDecodeError, BodyTooLarge, Disconnected) as exc:
            await _refuse(MessagesWriter(send, 0).send, exc)
            return
        await respond(send, 200, count_tokens_body(estimate_prompt_tokens(chat)))

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
            await _refuse(send, exc)
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
            await _refuse(send, exc)
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
            await _refuse_in_stream(send, faults.error_event.status, job.stream)
            return True
        return False


def _vector(text: str, size: int = 8) -> list[float]:
    """An embedding of ``text``: ``size`` numbers in [-1, 1) drawn from its digest."""
    digest = hashlib.blake2b(text.encode(), digest_size=size).digest()
    return [(b - 128) / 128 for b in digest]


def _model_named(body: Any) -> str:
    return str(body.get("model")) if isinstance(body, dict) else ""


async def _refuse_in_stream(send: Send, code: int, stream: bool) -> None:
    """vLLM 0.32's load shedding in its second form: a streaming request answered 200, then one
    error event carrying ``code`` (its shape exactly: ``type`` the status's phrase, ``param``
    null) and ``[DONE]``; a non-streaming one gets the status."""
    msg = "injected fault: the engine is currently busy and cannot accept new requests"
    if not stream:
        await respond(send, code, error_body(msg, code))
        return
    error = {"message": msg, "type": HTTPStatus(code).phrase, "param": None, "code": code}
    event = b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
    start = {"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS}
    await send(start)
    await send({"type": "http.response.body", "body": event + DONE_EVENT, "more_body": False})


async def _refuse(send: Send, exc: Exception) -> None:
    """The JSON error vLLM gives a request it cannot take: a body over the limit (413), JSON
    that does not parse, a request it refuses (its status), a bad ``x-sim-fault`` header."""
    if isinstance(exc, BodyTooLarge):
        code, message = 413, "request body too large"
    elif isinstance(exc, orjson.JSONDecodeError):
        code, message = 400, f"malformed JSON body: {exc}"
    elif isinstance(exc, BadRequest):
        await respond(send, exc.code, error_body(str(exc), exc.code, exc.name))
        return
    else:
        code, message = 400, str(exc)
    await respond(send, code, error_body(message, code))


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
