"""Which logical call a request of an unmodified SDK belongs to, and what its retries may do.

No I/O: the transports (``_sync_transport``, ``_async_transport``) ask and carry it out.

A Stainless SDK (openai, anthropic, llama-stack-client) rebuilds the request for each retry from
the same options and says which try it is in ``x-stainless-retry-count``; openai and
llama-stack-client generate an idempotency key per call but never send it. So a call is known
by the SDK's own ``Idempotency-Key`` where it sends one; else a retry (count >= 1) belongs to
the call the same task or thread made last through this transport (the SDK retries inside its
own ``request()``, in the caller's context) when its method, URL and body are the same, or else
to the oldest call with that request still waiting for a retry to claim its attempt.
"""

from __future__ import annotations

import contextvars
import hashlib
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from streamsafe.retry import Outcome, nothing_started

__all__ = [
    "CURRENT_CALL",
    "NOT_RESENT",
    "CallBook",
    "LogicalCall",
    "attempt_outcome",
    "retry_count",
    "should_retry_header",
]

#: What :meth:`CallBook.enter` gives a retry that must not go out: its call's last request was
#: lost after it was sent (the engine may hold it) and the server is not known to key its work.
NOT_RESENT = object()

#: The header by which a streamsafe gateway names the generation an answer came from: a server
#: that sends it attaches a request carrying a running call's Idempotency-Key to that call.
KEYED_ANSWER = "x-streamsafe-generation"

#: The statuses a Stainless SDK retries (``_should_retry``): 408, 409, 429 and every 5xx.
SDK_RETRY_STATUSES = frozenset({408, 409, 429})


def retry_count(headers: Mapping[str, str]) -> int:
    """The SDK's ``x-stainless-retry-count`` (0 where absent or unreadable)."""
    try:
        return max(0, int(headers.get("x-stainless-retry-count", "0")))
    except ValueError:
        return 0


def fingerprint(method: str, url: str, body: bytes) -> bytes:
    """What a retry repeats of its first attempt: the method, the URL and the body."""
    h = hashlib.sha256(method.encode() + b" " + url.encode() + b"\n")
    h.update(body)
    return h.digest()


def origin(url: str) -> str:
    """The scheme, host and port of ``url``: whom a request went to."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def attempt_outcome(package: Any, exc: BaseException) -> Outcome:
    """An attempt's transport error (an exception of ``package``, httpx or httpx2) as the
    retry core's outcome: whether the request can have reached the server."""
    if isinstance(exc, package.ConnectError):
        return Outcome.connect_failed(detail=repr(exc))
    if isinstance(exc, package.ConnectTimeout):
        return Outcome.timed_out("connect")
    if isinstance(exc, package.PoolTimeout):
        return Outcome.timed_out("pool")
    if isinstance(exc, (package.WriteError, package.WriteTimeout)):
        # The body never arrived whole: no server starts on half a JSON body.
        return Outcome.connect_failed(detail=f"request not sent whole ({exc!r})")
    return Outcome.disconnected(detail=f"connection lost before the response ({exc!r})")


def should_retry_header(status: int, headers: Mapping[str, str]) -> str | None:
    """``"false"`` for an answer the SDK would retry although the work may have started there
    (a 500, 502, 504, 408, 409: the engine may hold it, or have failed at it), so it sends no
    copy; ``None`` to leave the answer as it is: the server said so itself
    (``x-should-retry``), the SDK does not retry it, or nothing started (429, 503)."""
    if "x-should-retry" in headers:
        return None
    if status < 500 and status not in SDK_RETRY_STATUSES:
        return None
    if nothing_started(Outcome.status(status, dict(headers))):
        return None
    return "false"


@dataclass(eq=False)
class LogicalCall:
    """One call of the SDK: its key (sent on every request of it), what its requests repeat,
    and the attempt that may have reached the server which the SDK stopped waiting for
    (``pending``: a future or task; ``None`` while none is)."""

    key: str
    fingerprint: bytes
    owner: object
    sent: int = 0  # requests the transport sent for it (its retries that attach send none)
    pending: Any = None
    #: Bumped whenever the SDK stops or starts waiting on ``pending``: an expiry scheduled
    #: under an older number finds a retry came since, and leaves the attempt alone.
    turn: int = 0
    waiting: bool = field(default=False)
    #: Why its last request may have reached the server and got no answer (``None``: it did
    #: not): a retry of it is not sent, unless the server keys its work.
    lost: str | None = None


#: The call this task or thread last made through a transport (the SDK retries inside it).
CURRENT_CALL: contextvars.ContextVar[LogicalCall | None] = contextvars.ContextVar(
    "streamsafe_sdk_call", default=None
)


class CallBook:
    """The calls of one transport whose attempt is left running for a retry to take up
    (thread-safe: the synchronous transport serves many threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._orphans: list[LogicalCall] = []
        self._keyed: set[str] = set()  # origins that answered as a streamsafe gateway

    def enter(
        self,
        owner: object,
        method: str,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        current: LogicalCall | None,
    ) -> tuple[LogicalCall, Any]:
        """The call a request belongs to (``current``, the last call of this task or thread,
        or a call left waiting, where it is a retry of it; else a new call) and the attempt
        of it still running that the request waits on instead of being sent (``None``: send
        it; :data:`NOT_RESENT`: refuse it, see :meth:`failed`). One step under the lock, so an
        expiry cannot end the attempt in between and a second retry cannot take the same one."""
        fp = fingerprint(method, url, body)
        sdk_key = headers.get("idempotency-key")
        with self._lock:
            call = self._find(owner, fp, sdk_key, current) if retry_count(headers) else None
            if call is None:
                key = sdk_key or f"streamsafe-{uuid.uuid4()}"
                return LogicalCall(key=key, fingerprint=fp, owner=owner), None
            if call in self._orphans:
                self._orphans.remove(call)
            call.turn += 1
            call.waiting = call.pending is not None
            if call.pending is None and call.lost and origin(url) not in self._keyed:
                return call, NOT_RESENT
            return call, call.pending

    def _find(
        self, owner: object, fp: bytes, sdk_key: str | None, current: LogicalCall | None
    ) -> LogicalCall | None:
        for call in (current,) if current is not None and current.owner is owner else ():
            if call.fingerprint == fp and sdk_key in (None, call.key):
                return call
        for call in self._orphans:
            if call.fingerprint == fp and sdk_key in (None, call.key):
                return call
        return None

    def left_running(self, call: LogicalCall, attempt: Any) -> int:
        """The SDK stopped waiting for ``attempt`` (its timeout): keep it for a retry. Returns
        the turn an expiry must present to end it."""
        with self._lock:
            call.pending = attempt
            call.waiting = False
            call.turn += 1
            if call not in self._orphans:
                self._orphans.append(call)
            return call.turn

    def failed(self, call: LogicalCall, outcome: Outcome) -> None:
        """The call's attempt ended without an answer: where it may have reached the server
        (the retry core's :func:`~streamsafe.retry.nothing_started` says no), the SDK's retry
        of it is refused instead of sent; where nothing can have started, it goes out."""
        with self._lock:
            call.pending = None
            call.waiting = False
            call.lost = None if nothing_started(outcome) else outcome.describe()

    def answered(self, url: str, headers: Mapping[str, str]) -> None:
        """An answer came: a server that keys its work (a streamsafe gateway) is remembered, and
        a retry of a lost request to it goes out (it attaches, never runs twice)."""
        if KEYED_ANSWER in headers:
            with self._lock:
                self._keyed.add(origin(url))

    def settled(self, call: LogicalCall) -> None:
        """The call's attempt was answered (or gave its waiter up): nothing is pending."""
        with self._lock:
            call.pending = None
            call.waiting = False
            call.lost = None

    def expire(self, call: LogicalCall, turn: int) -> Any:
        """No retry came for ``call`` within the grace after ``turn``: the attempt to end (its
        answer to close), or ``None`` where a retry claimed it since."""
        with self._lock:
            if call.turn != turn or call.waiting:
                return None
            if call in self._orphans:
                self._orphans.remove(call)
            attempt, call.pending = call.pending, None
            return attempt

    def orphans(self) -> int:
        """Calls whose attempt runs with nobody waiting (a gauge for tests and logs)."""
        with self._lock:
            return len(self._orphans)
