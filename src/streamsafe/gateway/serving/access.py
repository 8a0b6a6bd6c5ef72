"""The access log: one line per answered request, written once at its end.

:class:`Access` follows one request through the gateway: the request id (the client's
``x-request-id`` where it sent a usable one, else one made here, and sent back in
``x-request-id``), the status of the answer (seen as it starts, through :meth:`Access.sender`),
the tenant, and, for a completion, the generation it joined and how. At the end
:meth:`Access.fields` says what happened (:func:`outcome`) and what it took; nothing is done per
chunk. The logger is ``streamsafe.access``, at INFO; health probes and scrapes (``/health``,
``/ready``, ``/metrics``) at DEBUG, so a load balancer's polling does not fill the log.
"""

from __future__ import annotations

import itertools
import logging
import os
from typing import Any

from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.serving.subscriber import Subscriber
from streamsafe.server.asgi import Message, Scope, Send, header

__all__ = [
    "JOINED",
    "OUTCOMES",
    "Access",
    "access_log",
    "completion_tokens",
    "outcome",
    "prompt_tokens",
    "write_access",
]

access_log = logging.getLogger("streamsafe.access")

#: How a completion request found its generation: it started it, or attached to a live one,
#: replayed a finished one, resumed one with ``Last-Event-ID``.
JOINED = ("new", "attached", "replayed", "resumed")
#: What ``outcome`` may say (see :func:`outcome`).
OUTCOMES = (
    "completed",
    "continued",
    "attached",
    "replayed",
    "resumed",
    "shed",
    "failed",
    "left",
)
#: Paths polled by load balancers and scrapers: logged at DEBUG.
_PROBES = frozenset({"/health", "/ready", "/metrics"})
_USAGE_KEY = b'"completion_tokens":'
_PROMPT_KEY = b'"prompt_tokens":'
_ids = itertools.count()
_ID_PREFIX = os.urandom(4).hex()


def _request_id(scope: Scope) -> str:
    given = header(scope, b"x-request-id")
    if given is not None and 0 < len(given) <= 128 and all(33 <= c <= 126 for c in given):
        return given.decode("ascii")
    return f"req-{_ID_PREFIX}{next(_ids):x}"


class Access:
    """One request's record for its access line (see the module)."""

    __slots__ = (
        "completion",
        "gen",
        "joined",
        "method",
        "model",
        "path",
        "request_id",
        "span",
        "started",
        "status",
        "stream",
        "sub",
        "tenant",
    )

    def __init__(self, scope: Scope, started: float) -> None:
        self.request_id = _request_id(scope)
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.started = started
        #: The status of the answer, once its start went out (``None``: none did).
        self.status: int | None = None
        self.tenant: str | None = None
        #: The model the request named, where the gateway read it (its metrics' label).
        self.model: str | None = None
        #: The generation a completion request joined, and how (one of :data:`JOINED`).
        self.gen: Generation | None = None
        self.joined = ""
        self.sub: Subscriber | None = None
        self.stream = False
        #: A completion request (its line says how it ended).
        self.completion = False
        #: Its tracing span, where tracing is on.
        self.span: Any = None

    def sender(self, send: Send) -> Send:
        """``send`` noting the answer's status and adding ``x-request-id`` to its headers."""
        rid = self.request_id.encode()

        async def send_(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
                headers = [*message.get("headers", ()), (b"x-request-id", rid)]
                message = {**message, "headers": headers}
            await send(message)

        return send_

    def join(self, gen: Generation, new: bool, resumed: bool, finished: bool) -> None:
        """The completion request joined ``gen``: started it (``new``), resumed it, replayed it
        (``finished`` when joined) or attached to it."""
        self.gen = gen
        self.joined = (
            "new" if new else "resumed" if resumed else "replayed" if finished else "attached"
        )

    @property
    def level(self) -> int:
        """The access line's level: INFO, DEBUG for a health check or a scrape."""
        return logging.DEBUG if self.path in _PROBES else logging.INFO

    def fields(self, now: float) -> dict[str, Any]:
        """The access line's fields at ``now``."""
        fields: dict[str, Any] = {
            "request_id": self.request_id,
            "tenant": self.tenant,
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "duration_ms": round((now - self.started) * 1000, 1),
        }
        if not self.completion:
            return fields
        gen = self.gen
        fields["stream"] = self.stream
        fields["outcome"] = outcome(self.status, self.joined, gen, self.sub)
        if gen is None:  # refused before it reached a generation
            return fields
        fields["generation"] = gen.id
        fields["joined"] = self.joined
        fields["attempts"] = gen.attempts
        plan = gen.plan
        if plan is not None:
            # Every request sent upstream for it, by kind, and the most its plan allowed.
            fields["asks"] = plan.asks
            fields["asked"] = plan.summary() or None
            fields["asks_bound"] = plan.most_asks
        fields["engine"] = gen.engine
        if self.stream:
            fields["ttft_ms"] = self.ttft_ms()
        fields["completion_tokens"] = completion_tokens(gen)
        return fields

    def ttft_ms(self) -> float | None:
        """Milliseconds from this request to its generation's first event (0 where the
        generation had it before the request came), ``None`` where none came."""
        gen = self.gen
        if gen is None or gen.first_event_at is None:
            return None
        return round(max(0.0, gen.first_event_at - self.started) * 1000, 1)


def outcome(status: int | None, joined: str, gen: Generation | None, sub: Subscriber | None) -> str:
    """What became of a completion request: ``shed`` (refused before any work: 429, or 503
    while draining, or told to come back), ``failed`` (an error status, or a stream that ended
    with an error event), ``left`` (the client went away first), else how it was served:
    ``completed`` (a generation it started, in one attempt), ``continued`` (one it started,
    continued after a broken attempt), ``attached``, ``replayed`` or ``resumed``."""
    if status == 429 or (sub is not None and sub.hold):
        return "shed"
    if status == 503 and (gen is None or gen.failure is None):  # draining, not the engine
        return "shed"
    if status is not None and status >= 400:
        return "failed"
    if gen is None or (sub is not None and sub.gone):
        return "left"
    state = gen.state
    if state is State.FAILED or state is State.ABORTED:
        return "failed"
    if state is not State.DONE or status is None:
        return "left"
    if joined == "new":
        return "continued" if gen.continuations else "completed"
    return joined


def completion_tokens(gen: Generation) -> int | None:
    """The completion tokens the usage of ``gen``'s answer says, where its log is in this
    process and its last events (the non-streamed answer, or a stream's usage chunk) carry
    one; read once, at the end, never per chunk."""
    if gen.completion_tokens is None:
        gen.completion_tokens = _usage(gen, _USAGE_KEY)
    return gen.completion_tokens


def prompt_tokens(gen: Generation) -> int | None:
    """The prompt tokens the usage of ``gen``'s answer says (as :func:`completion_tokens`)."""
    return _usage(gen, _PROMPT_KEY)


def _usage(gen: Generation, key: bytes) -> int | None:
    if gen.state is not State.DONE or not gen.length:
        return None
    for payload in reversed(gen.log.read_nowait(max(0, gen.length - 3))):
        at = payload.rfind(key)
        if at < 0:
            continue
        digits = payload[at + len(key) :].lstrip()[:12]
        end = 0
        while end < len(digits) and 48 <= digits[end] <= 57:
            end += 1
        if end:
            return int(digits[:end])
    return None


def write_access(access: Access, fields: dict[str, Any]) -> None:
    """Write ``access``'s line with its ``fields`` (at :attr:`Access.level`)."""
    access_log.log(
        access.level,
        "%s %s %s %.1f ms",
        access.method,
        access.path,
        access.status,
        fields["duration_ms"],
        extra={"fields": fields},
    )
