"""A completion request served: its body read, its generation opened (found or started by the
registry), and the generation written to its subscriber, streamed or as one JSON answer. Also a
Responses stream the gateway holds, asked for again (``starting_after``) or cancelled.

The registry is seen through :class:`GenerationSource`: serving imports no assembly module.
"""

from __future__ import annotations

from typing import Protocol

from streamsafe.gateway.admission.admission import Admission, Shed
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.errors import (
    BadRequest,
    Draining,
    FleetUnsafe,
    KeyReused,
    LiveDuplicate,
    NotResumable,
    ResumePastEnd,
    error_body,
    send_failure,
    shutting_down,
)
from streamsafe.gateway.generations.framing import framing_for
from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.generations.generation_index import GenerationIndex
from streamsafe.gateway.generations.refusals import EngineRefused
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.metrics.counters import Counters
from streamsafe.gateway.serving.access import Access
from streamsafe.gateway.serving.api_keys import ApiKeys, reads_stored_state
from streamsafe.gateway.serving.body_work import BodyWorker
from streamsafe.gateway.serving.completion_id import own_completion_id
from streamsafe.gateway.serving.pacing import StreamRules
from streamsafe.gateway.serving.requests import (
    client_read_timeout,
    completion_request,
    last_attempt,
    read_request_body,
)
from streamsafe.gateway.serving.responses import (
    cancel_request,
    cancelled,
    find_response,
    resume_request,
    start_after,
)
from streamsafe.gateway.serving.stream_terms import StreamTerms
from streamsafe.gateway.serving.subscriber import Subscriber, serve_json, serve_stream
from streamsafe.gateway.tracing import Tracing
from streamsafe.gateway.upstream.kinds import CompletionRoute, Wire
from streamsafe.server.asgi import (
    Receive,
    Scope,
    Send,
    body_writer,
    interim_writer,
    reset_connection,
    respond,
)

__all__ = ["Completions", "GenerationSource"]


class GenerationSource(Protocol):
    """What serving a completion asks of the registry
    (:class:`~streamsafe.gateway.registry.Registry`)."""

    #: The gateway's counters (requests, retries seen, shed).
    counters: Counters

    @property
    def generations(self) -> GenerationIndex:
        """The generations this process holds (a Responses stream found by its response id)."""
        ...

    async def open(self, req: GenerationRequest) -> tuple[Generation, int]:
        """The generation ``req`` belongs to and the offset its subscriber reads from."""
        ...

    def rejoin(self, gen: Generation, start: int) -> int:
        """A subscriber resuming ``gen`` from ``start``, found by its response id."""
        ...

    def leave(self, gen: Generation, hold: float = 0.0) -> None:
        """A subscriber is gone."""
        ...

    async def end(self, gen: Generation, error: bytes, status: int) -> None:
        """End ``gen`` now with ``error``."""
        ...


class Completions:
    """Serves completion requests from ``registry``'s generations. ``api_keys`` names each
    request's tenant; ``tracing`` links a request's span to its generation's. Large bodies are
    read off the event loop, on a thread :meth:`close` stops."""

    def __init__(
        self,
        config: GatewayConfig,
        registry: GenerationSource,
        admission: Admission,
        tracing: Tracing,
        api_keys: ApiKeys,
    ) -> None:
        self._config = config
        self._registry = registry
        self._admission = admission
        self._tracing = tracing
        self._api_keys = api_keys
        self._rules = StreamRules.from_config(config)
        self._bodies = BodyWorker()  # large bodies are read off the event loop

    def close(self) -> None:
        """Stop the body thread (shutdown)."""
        self._bodies.close()

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, route: CompletionRoute, access: Access
    ) -> None:
        """Serve a completion request on ``route``: read it, open its generation, write the
        generation to it."""
        counters = self._registry.counters
        counters.requests_received += 1
        access.completion = True
        tenant = access.tenant = self._api_keys.tenant(scope)
        raw = await read_request_body(scope, receive, self._config.max_body_bytes)
        if route.wire is Wire.OPENAI_RESPONSES and reads_stored_state(raw):
            self._api_keys.check_tenant_state(tenant)
        req = await self._bodies.run(
            len(raw),
            completion_request,
            scope,
            raw,
            route,
            tenant,
            self._config.default_max_tokens,
            self._config.forward_authorization,
        )
        access.stream = req.stream
        access.model = req.model
        if req.retry:
            counters.retries_seen += 1
        opened = await self._open(req, send)
        if opened is None:
            return
        gen, start = opened
        access.join(gen, gen.request is req, req.last_event_id is not None, gen.finished)
        if access.span is not None:
            if access.joined == "new":  # before its reader task first runs: its attempts see it
                gen.trace = self._tracing.generation(gen.id, access.span)
            else:
                self._tracing.link(access.span, gen.trace)
        sub = access.sub = Subscriber(gen, client_read_timeout(scope), last_attempt(scope))
        if gen.request is not req and not (
            req.idempotency_key or req.retry or req.last_event_id is not None
        ):
            # Joined only by being identical (collapse_identical): another caller's answer,
            # so a completion id of its own.
            sub.rename = own_completion_id()
        await self._send_generation(sub, start, route, req.stream, scope, receive, send)

    async def _open(self, req: GenerationRequest, send: Send) -> tuple[Generation, int] | None:
        """``req``'s generation and the offset to read from, opened by the registry; its
        refusals raised as the :class:`~streamsafe.gateway.errors.BadRequest` a client gets, or
        ``None`` where the engine's refusal was answered from memory (sent here)."""
        try:
            return await self._registry.open(req)
        except KeyReused:
            raise BadRequest(
                422, "Idempotency-Key was already used with a different request body"
            ) from None
        except LiveDuplicate:
            raise BadRequest(409, "a request with this Idempotency-Key is in progress") from None
        except NotResumable:
            raise BadRequest(410, "the stream to resume is no longer held by the gateway") from None
        except ResumePastEnd as exc:
            raise BadRequest(400, exc.message, param="Last-Event-ID") from None
        except Draining:
            raise shutting_down() from None
        except FleetUnsafe as exc:
            ra = [(b"retry-after", b"%d" % exc.retry_after)]
            raise BadRequest(503, exc.message, headers=ra) from None
        except EngineRefused as exc:
            await send_failure(send, exc.failure)
            return None
        except Shed as exc:
            self._registry.counters.shed += 1
            msg = f"gateway at capacity ({exc.reason}); retry after {exc.retry_after} s"
            ra = [(b"retry-after", str(exc.retry_after).encode())]
            raise BadRequest(429, msg, headers=ra) from None

    async def answer_held_response(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        access: Access,
        tenant: str,
        method: str,
        path: str,
    ) -> bool:
        """Answer a Responses-API request about a stream held here: asked again from an event
        (resumed from the log) or cancelled; False where it is no such request, or no such
        stream is held here (the server answers instead)."""
        again = resume_request(method, path, scope["query_string"])
        if again is not None and await self._resume_response(
            scope, receive, send, access, tenant, *again
        ):
            return True
        cancel = cancel_request(method, path)
        return cancel is not None and await self._cancel_response(send, tenant, cancel)

    async def _resume_response(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        access: Access,
        tenant: str,
        response_id: str,
        after: int | None,
    ) -> bool:
        """Serve ``GET /v1/responses/{id}?stream=true&starting_after=N`` from the log of the
        stream held here; False where none is (the server answers instead)."""
        gen = find_response(self._registry.generations, tenant, response_id)
        if gen is None:
            return False
        start = await start_after(gen.log, after)
        if start is None:
            msg = f"response {response_id} has no event numbered {after} (yet)"
            raise BadRequest(400, msg, param="starting_after")
        route = gen.request.route
        access.completion = access.stream = True
        start = self._registry.rejoin(gen, start)
        access.join(gen, False, True, gen.finished)
        sub = access.sub = Subscriber(gen, client_read_timeout(scope), last_attempt(scope))
        await self._send_generation(sub, start, route, True, scope, receive, send)
        return True

    async def _cancel_response(self, send: Send, tenant: str, response_id: str) -> bool:
        """``POST /v1/responses/{id}/cancel`` of a stream this process runs: end it for every
        subscriber and close its upstream request; False where none is (passed through)."""
        gen = find_response(self._registry.generations, tenant, response_id)
        if gen is None or not gen.live or gen.task is None:
            return False
        why = error_body(f"response {response_id} was cancelled", "cancelled", 409)
        await self._registry.end(gen, why, 409)
        await respond(send, 200, cancelled(response_id))
        return True

    async def _send_generation(
        self,
        sub: Subscriber,
        start: int,
        route: CompletionRoute,
        stream: bool,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Send ``sub`` its generation from offset ``start``, streamed or as one JSON answer;
        it leaves the generation when done."""
        gen = sub.gen
        sub.listen(scope, receive)
        try:
            if stream:
                # Where the gateway speaks Llama Stack's way (no [DONE]) for an upstream that
                # ends with it, a failed stream ends with a reset: llama-stack-client ignores
                # error events, so its caller sees a transport error instead of a short answer
                # that reads as complete. Behind Llama Stack itself, its own way (a masked error
                # event, then a clean end) is relayed as it came.
                reset = reset_connection(scope) if route.reset_on_failure else None
                terms = StreamTerms(
                    self._rules,
                    self._admission,
                    drop_done=not route.client_done,
                    reset_on_failure=reset,
                    preamble=route.preamble,
                    writer=body_writer(scope),
                    framing=framing_for(route),
                )
                await serve_stream(sub, start, send, terms)
            else:
                await serve_json(sub, send, self._rules, self._admission, interim_writer(scope))
        finally:
            await sub.unlisten()
            if sub.hold:  # told to come back: refused for now, by admission
                self._registry.counters.shed += 1
            self._registry.leave(gen, sub.hold)
