"""What went wrong in a call, as a retry :class:`~streamsafe.retry.Outcome` and as the error
raised to the caller (each carrying the call's attempts, resumes and Idempotency-Key). Mixed into
:class:`~streamsafe.client._call.Call`; no I/O.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from typing import Any

import httpx2

from streamsafe.client._answers import not_an_object, parse_error_body, text_of
from streamsafe.client.errors import (
    APIConnectionError,
    APIResponseError,
    APIStatusError,
    APITimeoutError,
    StreamError,
    StreamInterrupted,
    StreamsafeError,
    status_error,
)
from streamsafe.retry import Decision, Outcome

__all__ = ["MAX_ERROR_BODY", "CallFailures"]

#: The most bytes of an error response body read (and kept on the error).
MAX_ERROR_BODY = 64 * 1024


def _is_refused(exc: BaseException) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ConnectionRefusedError):
            return True
        if isinstance(cur, OSError) and cur.errno == errno.ECONNREFUSED:
            return True
        if "refused" in str(cur).lower():
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _request_of(exc: httpx2.TransportError) -> httpx2.Request | None:
    try:
        return exc.request
    except RuntimeError:  # raised before a request was attached
        return None


class CallFailures:
    """The failures of one call (see the module); :class:`~streamsafe.client._call.Call` holds
    the attributes below."""

    __slots__ = ()

    method: str
    url: str
    attempts: int
    resumes: int
    idempotency_key: str | None
    last_event_id: str | None
    resumable: bool
    read_bound_by_total: bool

    def past_deadline(self) -> bool:
        """Whether the call's deadline has passed (the call knows its clock)."""
        raise NotImplementedError

    def kw(self) -> dict[str, Any]:
        """What every error of this call carries: attempts, resumes, idempotency_key."""
        return {
            "attempts": self.attempts,
            "resumes": self.resumes,
            "idempotency_key": self.idempotency_key,
        }

    def request_failure(self, exc: httpx2.TransportError) -> tuple[Outcome, StreamsafeError]:
        """A request that got no response headers: what happened, and the error to raise."""
        kw: dict[str, Any] = {**self.kw(), "request": _request_of(exc)}
        if isinstance(exc, httpx2.TimeoutException):
            if isinstance(exc, httpx2.PoolTimeout):
                phase = "pool"
            elif isinstance(exc, httpx2.ConnectTimeout):
                phase = "connect"
            elif isinstance(exc, httpx2.WriteTimeout):
                phase = "write"
            else:
                phase = "first_byte"
            if self.read_bound_by_total and self.past_deadline():
                phase = "total"
            out = Outcome.timed_out(phase)  # type: ignore[arg-type]
            return out, APITimeoutError(
                f"{phase} timeout: {self.method} {self.url}", phase=phase, **kw
            )
        if isinstance(exc, httpx2.ConnectError):
            refused = _is_refused(exc)
            err = APIConnectionError(
                f"{'connection refused' if refused else 'connect error'}: {self.url} ({exc})", **kw
            )
            err.refused = refused
            return Outcome.connect_failed(refused=refused, detail=f"connect error ({exc})"), err
        detail = f"connection lost before the response ({type(exc).__name__})"
        return Outcome.disconnected(detail=detail), APIConnectionError(f"{detail}: {exc}", **kw)

    def status_failure(
        self, response: httpx2.Response, raw: bytes
    ) -> tuple[Outcome, StreamsafeError]:
        headers = {k.lower(): v for k, v in response.headers.items()}
        err = status_error(
            response.status_code, parse_error_body(raw), headers, response=response, **self.kw()
        )
        return Outcome.status(response.status_code, headers), err

    def refusal_failure(
        self, status: int, data: dict[str, Any], headers: Mapping[str, str]
    ) -> tuple[Outcome, StreamsafeError]:
        """A stream answered 2xx whose first event refused it with ``status`` (vLLM's load
        shedding in-band): the uncommitted outcome of that status, and the error it raises."""
        kept = {k.lower(): v for k, v in headers.items()}
        err = status_error(status, data, kept, **self.kw())
        return Outcome.refused_in_band(status, kept), err

    def stream_failure(self, exc: BaseException | None, events: int) -> Outcome:
        """A committed stream broke: ``exc`` is the transport error, ``None`` for a clean end
        before ``[DONE]``."""
        # Resuming needs a Last-Event-ID once chunks were delivered: without one the server
        # replays from the start and the caller would see those chunks twice.
        resumable = self.resumable and (events == 0 or self.last_event_id is not None)
        if isinstance(exc, httpx2.ReadTimeout):
            if self.past_deadline():
                return Outcome.timed_out("total", committed=True, events=events)
            return Outcome.timed_out("idle", events=events, resumable=resumable)
        if exc is None:
            detail = "stream truncated before [DONE]"
        else:
            detail = f"connection lost ({type(exc).__name__})"
        if self.resumable and not resumable:
            detail += ", no event id to resume from"
        return Outcome.broken(events=events, resumable=resumable, detail=detail)

    def body_failure(self, exc: httpx2.TransportError) -> StreamsafeError:
        """The error for a plain call whose body was lost after the headers."""
        kw = self.kw()
        if isinstance(exc, httpx2.ReadTimeout):
            phase = "total" if self.past_deadline() else "idle"
            return APITimeoutError(f"{phase} timeout reading the response body", phase=phase, **kw)
        return APIConnectionError(f"connection lost reading the response body: {exc}", **kw)

    def interrupted(
        self, outcome: Outcome, decision: Decision, chunks: list[Any]
    ) -> StreamInterrupted:
        text = text_of(chunks)
        return StreamInterrupted(
            f"stream interrupted after {len(chunks)} chunks: {decision.reason}",
            reason=outcome.describe(),
            chunks=chunks,
            text=text,
            **self.kw(),
        )

    def closed_client(self) -> APIConnectionError:
        """The error for a request on a closed client: a mistake to fix, never retried."""
        return APIConnectionError(f"cannot send to {self.url}: the client is closed", **self.kw())

    def closed_mid_stream(self, chunks: list[Any]) -> StreamInterrupted:
        """A stream whose client was closed while it was read: never resumed."""
        return StreamInterrupted(
            f"stream interrupted after {len(chunks)} chunks: its client was closed",
            reason="client closed",
            chunks=chunks,
            text=text_of(chunks),
            **self.kw(),
        )

    def error_answer(self, data: dict[str, Any], headers: dict[str, str]) -> APIStatusError:
        """The error for a 2xx answer whose body is an error object: a server that had to send
        its status before the work ended (the gateway's JSON keep-alive) reports a failure
        that way. Its ``code`` is the status where it is one; else 500."""
        error = data.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        status = code if isinstance(code, int) and 400 <= code <= 599 else 500
        return status_error(status, data, headers, **self.kw())

    def stream_error(self, data: dict[str, Any], chunks: list[Any]) -> StreamError:
        error = data.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        return StreamError(
            f"error event in stream: {message or error!r}",
            error=error,
            chunks=chunks,
            text=text_of(chunks),
            **self.kw(),
        )

    def not_an_event_stream(self, response: httpx2.Response, raw: bytes) -> StreamsafeError:
        """The error for a stream answered 2xx with a body that is not an event stream (a JSON
        error or a whole completion): the server's own error where it sent one, else
        :class:`APIResponseError` carrying the body. Committed: never re-sent."""
        ctype = response.headers.get("content-type", "")
        body = parse_error_body(raw)
        error = body.get("error") if isinstance(body, dict) else None
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else None
            return StreamError(
                f"stream answered with {ctype} instead of an event stream, carrying an error: "
                f"{message or error!r}",
                error=error,
                chunks=[],
                text="",
                **self.kw(),
            )
        return APIResponseError(
            f"a streaming request was answered with {ctype}, not an event stream "
            f"(status {response.status_code}): {raw[:200]!r}",
            body=body,
            **self.kw(),
        )

    def bad_event(self, raw: bytes, chunks: list[Any]) -> APIResponseError:
        """The error for a stream event that is not JSON, or JSON but not an object."""
        return APIResponseError(
            f"stream event is {not_an_object(raw)} after {len(chunks)} chunks: {raw[:200]!r}",
            body=raw[:MAX_ERROR_BODY].decode("utf-8", "replace"),
            **self.kw(),
        )

    def unreadable_stream(self, exc: Exception, chunks: list[Any]) -> APIResponseError:
        """The error for a committed stream whose bytes cannot be read as an event stream (an
        :class:`~streamsafe.sse.SSEError`, a broken content encoding): never resumed, the
        server would send the same bytes again."""
        return APIResponseError(
            f"unreadable event stream after {len(chunks)} chunks: {exc}", **self.kw()
        )

    def unusable_response(self, exc: Exception) -> APIResponseError:
        """The error for an answer that cannot be used (too many redirects, a body whose
        content encoding does not decode)."""
        return APIResponseError(f"unusable response from {self.url}: {exc}", **self.kw())

    def unusable_url(self, exc: Exception) -> APIConnectionError:
        """The error for a URL no connection can be made to (bad scheme, malformed): a
        setting to fix, so never retried."""
        return APIConnectionError(f"cannot send to {self.url}: {exc}", **self.kw())
