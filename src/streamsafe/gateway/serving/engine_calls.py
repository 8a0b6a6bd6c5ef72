"""The vLLM routes the gateway passes to one engine of its pool (see
:mod:`streamsafe.gateway.upstream.routes`): Responses, tokenize, render, audio and the rest
(completions and pooling calls are served: :mod:`streamsafe.gateway.serving.completions`).

An admitted route's request is read (a JSON body whole, bounded by ``max_body_bytes``; a
multipart form only until its ``model`` field, the rest streamed), counted at what it costs the
engine (:class:`~streamsafe.gateway.upstream.routes.Cost`), held in admission like a
generation, sent to an engine of its ``model`` chosen as a completion's is (its memory weighs on
that engine until the answer ends), and its answer passed back as it comes. A route that takes
no model goes to a live engine; a stored response's routes to the engine that holds it. The
engine's answer is the caller's, whatever it is: a body the gateway cannot read goes on
unread, and the engine says what is wrong with it, as it would straight.

What these routes do not get: coalescing, replay and resume (their answers are not logged), and
failover (a request whose engine fails is answered 502; its body may be half sent).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from streamsafe.gateway.admission.admission import Admission, Shed, request_cost
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.engines.engine_shell import EngineShell
from streamsafe.gateway.engines.engines import Engines
from streamsafe.gateway.engines.pool import Full, Unavailable
from streamsafe.gateway.errors import BadRequest
from streamsafe.gateway.serving.access import Access
from streamsafe.gateway.serving.api_keys import ANONYMOUS, STATE_FIELDS, ApiKeys
from streamsafe.gateway.serving.passthrough import ClientGone, pass_through, read_small_body
from streamsafe.gateway.serving.requests import read_request_body
from streamsafe.gateway.upstream.kinds import Wire
from streamsafe.gateway.upstream.request_views import cost_view
from streamsafe.gateway.upstream.routes import Cost, Route
from streamsafe.request_cost import MAX_REQUEST_COST, InvalidField
from streamsafe.server.asgi import Receive, Scope, Send
from streamsafe.tokens import estimate_input_tokens

__all__ = ["FORM_HEAD_LIMIT", "EngineCalls", "form_model"]

#: Bytes of a multipart form read, at most, to find its ``model`` field before the rest is
#: streamed (clients send the form's fields before its file: openai-python, curl ``-F`` in
#: order). A form whose ``model`` comes later goes to a live engine.
FORM_HEAD_LIMIT = 64 * 1024

_FORM_MODEL = re.compile(
    rb'content-disposition:[^\r\n]*[; ]name="?model"?(?:;[^\r\n]*)?\r\n'
    rb"(?:[^\r\n]+\r\n)*\r\n([^\r\n]{1,256})\r\n--",
    re.IGNORECASE,
)


def form_model(head: bytes) -> str | None:
    """The ``model`` field of the multipart form whose start is ``head``, or ``None`` where
    that start holds none (whole)."""
    found = _FORM_MODEL.search(head)
    return found.group(1).decode("utf-8", "replace") if found is not None else None


class EngineCalls:
    """Serves the admitted and engine routes (see the module) with ``engines``, holding each
    admitted request's place in ``admission``."""

    def __init__(
        self, config: GatewayConfig, engines: Engines, admission: Admission, api_keys: ApiKeys
    ) -> None:
        self._config = config
        self._engines = engines
        self._admission = admission
        self._api_keys = api_keys

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, route: Route, access: Access
    ) -> None:
        """Serve a request on an admitted ``route``: read as much as routing needs, admit it,
        pass it to an engine of its model."""
        body: bytes | None = None
        head = b""
        fields: Mapping[str, Any] = {}
        if route.multipart:
            head, ended = await _read_form_head(receive, FORM_HEAD_LIMIT)
            if ended:
                body, head = head, b""
            model = form_model(body if body is not None else head)
        else:
            body = await read_request_body(scope, receive, self._config.max_body_bytes)
            fields = _json_object(body)
            given = fields.get("model")
            model = given if isinstance(given, str) else None
        access.model = model
        if route.tenant_state and any(fields.get(k) is not None for k in STATE_FIELDS):
            self._api_keys.check_tenant_state(access.tenant)
        cost = self._cost(route.cost, fields)
        waiter = None
        if cost:
            try:
                waiter = self._admission.request(access.tenant or ANONYMOUS, cost)
            except ValueError as exc:
                raise BadRequest(400, str(exc)) from None
            except Shed as exc:
                raise _shed(exc) from None
            try:
                await self._admission.wait(waiter)
            except Shed as exc:
                raise _shed(exc) from None
            self._admission.commit(waiter)
        try:
            engine = await self._pick(model, cost)
            await self._send(engine, cost, scope, receive, send, body, head)
        finally:
            if waiter is not None:
                self._admission.release(waiter)

    async def serve_engine_route(
        self, scope: Scope, receive: Receive, send: Send, route: Route
    ) -> None:
        """Serve a request on a route that takes no model: a live engine, or, for a stored
        response, the engine that holds it."""
        engine = await self._holder(scope["path"]) if route.tenant_state else self._live()
        await self._send(engine, 0, scope, receive, send, None, b"")

    async def serve_passed_through(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass a request through unchanged (an upstream with pass-through: Llama Stack's many
        APIs) to an engine of the model its JSON body names, else to a live engine (see
        :meth:`Engines.live`). No admission, and the engine's breaker hears nothing of it (its
        answer is the caller's, whatever the route)."""
        try:
            body = await read_small_body(scope, receive)
        except ClientGone:
            return
        given = _json_object(body).get("model") if body is not None else None
        engine = self._engines.live(given if isinstance(given, str) else None)
        await pass_through(
            engine.upstream.pool,
            scope,
            receive,
            send,
            keep_authorization=self._config.forward_authorization,
            body=body,
        )

    async def serve_operator(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass an operator's request (its admin key checked) to the first engine, whatever its
        state: an operator's change (a cache reset, a sleep) must land on the engine the
        operator can name, not on whichever is live; another engine is called directly."""
        await self._send(self._engines.first, 0, scope, receive, send, None, b"")

    # -- the parts ------------------------------------------------------------------------------

    def _cost(self, cost: Cost, fields: Mapping[str, Any]) -> int:
        """Engine tokens a request of ``fields`` holds (0: no admission)."""
        default = self._config.default_max_tokens
        if cost is Cost.NONE:
            return 0
        if cost is Cost.FLAT:
            return default
        if cost is Cost.INPUT:
            return min(MAX_REQUEST_COST, max(1, estimate_input_tokens(fields)))
        try:
            if "input" in fields and "messages" not in fields:  # the Responses API
                view, chat = cost_view(Wire.OPENAI_RESPONSES, fields)
                return request_cost(view, default, chat=chat)
            if "messages" in fields or "prompt" in fields:
                return request_cost(fields, default, chat="messages" in fields)
        except InvalidField:
            return 1  # the engine answers its 400, as it would straight
        return min(MAX_REQUEST_COST, max(1, estimate_input_tokens(fields)) + default)

    async def _pick(self, model: str | None, cost: int) -> EngineShell:
        """The engine for a request of ``model`` holding ``cost`` tokens: picked as a
        completion's first attempt is; a live engine where it names no model."""
        engines = self._engines
        if model is None:
            return self._live()
        started = engines.clock()
        while True:
            pick = engines.pool.pick(model, engines.clock(), cost=cost, fallback=False)
            if isinstance(pick, Unavailable):
                if not pick.known:
                    raise BadRequest(404, f"no engine serves model {model!r}")
                ra = [(b"retry-after", b"%d" % max(1, round(pick.retry_after + 0.5)))]
                raise BadRequest(503, f"no engine of {model!r} takes work now", headers=ra)
            if isinstance(pick, Full):
                refused = await engines.wait_for_room(model, cost, started)
                if refused is not None:
                    after = refused.retry_after
                    ra = [(b"retry-after", after.encode())] if after else []
                    message = orjson.loads(refused.body)["error"]["message"]
                    raise BadRequest(refused.status, message, headers=ra)
                continue
            return engines.of(pick.engine)

    def _live(self) -> EngineShell:
        """A live engine (see :meth:`Engines.live`)."""
        return self._engines.live()

    async def _holder(self, path: str) -> EngineShell:
        """The engine that holds the stored response ``path`` names (asked in turn, where the
        pool has several engines); a live one where none says it does."""
        engines = self._engines
        if len(engines.shells) == 1:
            return engines.first
        response_id = path.removeprefix("/v1/responses/").split("/")[0]
        for engine in engines.shells:
            try:
                response = await engine.upstream.open("GET", f"/v1/responses/{response_id}")
                response.release()
            except OSError:  # an engine that does not answer holds nothing we can reach
                continue
            if response.status != 404:
                return engine
        return self._live()

    async def _send(
        self,
        engine: EngineShell,
        cost: int,
        scope: Scope,
        receive: Receive,
        send: Send,
        body: bytes | None,
        head: bytes,
    ) -> None:
        """Pass the request to ``engine``, its memory counted there until the answer ends; the
        engine's breaker hears how it went."""
        engines = self._engines
        upstream = engine.upstream
        load = engine.load
        load.memory += cost
        try:
            status = await pass_through(
                upstream.pool,
                scope,
                receive,
                send,
                keep_authorization=self._config.forward_authorization,
                body=body,
                head=head,
            )
        finally:
            load.memory -= cost
            if cost:
                engines.room_made()
        if status < 0:
            upstream.failed("unreachable")
        elif status >= 500:
            upstream.failed(f"answered {status}")
        elif status > 0:
            upstream.succeeded()
        else:
            upstream.abandoned()


def _json_object(body: bytes) -> Mapping[str, Any]:
    """``body`` as a JSON object, or empty where it is none (the engine answers it)."""
    if body.lstrip()[:1] == b"{":
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return {}
        if isinstance(doc, dict):
            return doc
    return {}


def _shed(exc: Shed) -> BadRequest:
    msg = f"gateway at capacity ({exc.reason}); retry after {exc.retry_after} s"
    return BadRequest(429, msg, headers=[(b"retry-after", str(exc.retry_after).encode())])


async def _read_form_head(receive: Receive, limit: int) -> tuple[bytes, bool]:
    """The start of a form's body: read until its ``model`` field is whole, the body ended
    (``True``) or ``limit`` bytes came."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BadRequest(400, "client disconnected before the body was complete")
        chunk = message.get("body", b"")
        parts.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(parts), True
        joined = b"".join(parts)
        if size >= limit or form_model(joined) is not None:
            return joined, False
