"""What happened to an attempt (:class:`Outcome`) and what to do next (:class:`Decision`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["TIMEOUT_PHASES", "Action", "Decision", "Outcome", "OutcomeKind", "TimeoutPhase"]

OutcomeKind = Literal["connect_error", "timeout", "disconnected", "status", "broken", "success"]
TimeoutPhase = Literal["connect", "write", "pool", "first_byte", "idle", "total"]
Action = Literal["retry", "resume", "give_up"]

#: Every phase a timeout can happen in, in the order an attempt goes through them.
TIMEOUT_PHASES: tuple[TimeoutPhase, ...] = (
    "pool",
    "connect",
    "write",
    "first_byte",
    "idle",
    "total",
)

# Only the headers the decision reads are kept, so an Outcome stays small and immutable.
_KEPT_HEADERS = frozenset({"retry-after", "retry-after-ms", "x-should-retry"})


def _keep(
    headers: Mapping[str, str] | Iterable[tuple[str, str]] | None,
) -> tuple[tuple[str, str], ...]:
    if headers is None:
        return ()
    items = headers.items() if isinstance(headers, Mapping) else headers
    return tuple((k.lower(), v) for k, v in items if k.lower() in _KEPT_HEADERS)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one attempt. Build it with the class methods, which say what each case
    means; ``committed`` is True once the response headers arrived (gRPC's commit point): from
    then on the call may only be resumed, never sent again."""

    kind: OutcomeKind
    committed: bool = False
    refused: bool = False
    phase: TimeoutPhase | None = None
    status_code: int | None = None
    headers: tuple[tuple[str, str], ...] = ()
    events: int = 0
    resumable: bool = False
    detail: str = ""

    @classmethod
    def connect_failed(cls, *, refused: bool = False, detail: str = "") -> Outcome:
        """No connection was made (``refused``: the port said no): the request never left."""
        return cls("connect_error", refused=refused, detail=detail)

    @classmethod
    def timed_out(
        cls,
        phase: TimeoutPhase,
        *,
        committed: bool = False,
        events: int = 0,
        resumable: bool = False,
    ) -> Outcome:
        """A timeout in ``phase``. ``idle`` happens only after the headers, so it is committed
        (a stalled stream); pass ``events``/``resumable`` for it as for :meth:`broken`."""
        if phase not in TIMEOUT_PHASES:
            raise ValueError(f"unknown timeout phase {phase!r}")
        if phase == "idle":
            committed = True
        return cls(
            "timeout",
            committed=committed,
            phase=phase,
            events=events,
            resumable=resumable,
            detail=f"{phase} timeout",
        )

    @classmethod
    def disconnected(cls, *, detail: str = "") -> Outcome:
        """The connection was lost after the request was sent, before any response header: the
        server may be working on it."""
        return cls("disconnected", detail=detail or "connection lost before the response")

    @classmethod
    def status(
        cls, status_code: int, headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None
    ) -> Outcome:
        """The server answered an error status (before any body was used)."""
        return cls("status", status_code=status_code, headers=_keep(headers))

    @classmethod
    def refused_in_band(
        cls, status_code: int, headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None
    ) -> Outcome:
        """A stream answered 2xx whose first event, before any chunk, is an error refusing it
        with ``status_code`` (see :func:`~streamsafe.retry.refusal.refusal_status`): nothing
        started, so it is the status it carries, not a committed failure."""
        detail = f"refused by its first event ({status_code})"
        return cls("status", status_code=status_code, headers=_keep(headers), detail=detail)

    @classmethod
    def broken(cls, *, events: int, resumable: bool, detail: str = "stream broke") -> Outcome:
        """A committed stream ended early after ``events`` events (reset, truncated without
        ``[DONE]``); ``resumable`` where the server answered ``X-Stream-Resumable: true``."""
        return cls("broken", committed=True, events=events, resumable=resumable, detail=detail)

    @classmethod
    def success(cls) -> Outcome:
        """The attempt completed."""
        return cls("success", committed=True)

    def header(self, name: str) -> str | None:
        """A kept response header (``retry-after``, ``retry-after-ms``, ``x-should-retry``)."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def should_retry_header(self) -> bool | None:
        """The server's ``x-should-retry`` verdict, or ``None`` where it gave none."""
        value = self.header("x-should-retry")
        if value is None:
            return None
        value = value.strip().lower()
        return True if value == "true" else False if value == "false" else None

    @property
    def spends_budget(self) -> bool:
        """Whether this outcome counts as a backend failure for a :class:`RetryBudget`: network
        failures, timeouts, broken streams, 5xx, 408 and 429. A 4xx is the caller's fault, not
        the backend's, and spends nothing."""
        if self.kind == "success":
            return False
        if self.kind == "status":
            code = self.status_code or 0
            return code >= 500 or code in (408, 429)
        return True

    def describe(self) -> str:
        """A short text for logs: ``status 503``, ``first_byte timeout``, ..."""
        if self.kind == "status":
            return self.detail or f"status {self.status_code}"
        if self.kind == "connect_error":
            return "connection refused" if self.refused else (self.detail or "connect error")
        if self.kind == "success":
            return "success"
        if self.committed:
            return f"{self.detail} after {self.events} events"
        return self.detail or self.kind


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do after an outcome: ``action`` is ``retry`` (send the request again after
    ``delay`` seconds), ``resume`` (reconnect with ``Last-Event-ID`` after ``delay``) or
    ``give_up``; ``reason`` says why, in words fit for a log line."""

    action: Action
    delay: float
    reason: str

    @property
    def retry(self) -> bool:
        """True for ``retry``."""
        return self.action == "retry"

    @property
    def resume(self) -> bool:
        """True for ``resume``."""
        return self.action == "resume"

    @property
    def give_up(self) -> bool:
        """True for ``give_up``."""
        return self.action == "give_up"
