"""The synchronous transport: what :func:`streamsafe.http_client` puts under an SDK's client.

Each attempt runs in a thread of its own while the SDK's thread waits for it as long as the
SDK's read timeout allows; when that passes, the SDK gets its ``ReadTimeout`` (and retries, as it
was built to) while the attempt keeps running, and the retry waits on that same attempt instead
of sending a copy. Written against the httpx-shaped package it is given (``httpx`` or
``httpx2``: the same API), which the class is built for in ``streamsafe.sdk``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from streamsafe.sdk._calls import (
    CURRENT_CALL,
    NOT_RESENT,
    CallBook,
    LogicalCall,
    attempt_outcome,
    should_retry_header,
)
from streamsafe.sdk._resume import StreamResume, is_resumable
from streamsafe.sdk._settings import TransportSettings
from streamsafe.sse import SSEError

__all__ = ["SyncShell"]

log = logging.getLogger("streamsafe.sdk")


class SyncShell:
    """The body of the synchronous transport class (mixed with the package's
    ``BaseTransport``); ``inner`` is the package's own ``HTTPTransport``."""

    def __init__(self, package: Any, inner: Any, settings: TransportSettings) -> None:
        self._h = package
        self._inner = inner
        self._settings = settings
        self.book = CallBook()

    def handle_request(self, request: Any) -> Any:
        """Send ``request`` as the attempt of its logical call, or wait on the attempt of it
        already running (see the module)."""
        body = request.read()
        call, attempt = self.book.enter(
            self, request.method, str(request.url), body, request.headers, CURRENT_CALL.get()
        )
        CURRENT_CALL.set(call)
        if request.method != "GET" and "idempotency-key" not in request.headers:
            request.headers["Idempotency-Key"] = call.key
        timeouts = dict(request.extensions.get("timeout") or {})
        if attempt is NOT_RESENT:
            raise self._h.RemoteProtocolError(
                f"not sent again: {call.lost}; the server may still be working on it",
                request=request,
            )
        if attempt is None:
            attempt = self._start(call, request, timeouts)
        else:
            log.info("a retry of %s waits on its first attempt instead of sending a copy", call.key)
        return self._wait(call, attempt, timeouts.get("read"), request)

    def _start(self, call: LogicalCall, request: Any, timeouts: dict[str, Any]) -> Any:
        # The headers may take longer than the SDK waits (the attempt outlives its timeout),
        # bounded by patience; once they came, the body's reads get the SDK's own limit.
        ext = {**timeouts, "read": self._settings.patience}
        request.extensions = {**request.extensions, "timeout": ext}
        attempt: concurrent.futures.Future[Any] = concurrent.futures.Future()
        call.sent += 1

        def run() -> None:
            try:
                response = self._inner.handle_request(request)
            except BaseException as exc:
                attempt.set_exception(exc)
                return
            ext["read"] = timeouts.get("read")
            attempt.set_result(response)

        threading.Thread(target=run, name="streamsafe-attempt", daemon=True).start()
        return attempt

    def _wait(self, call: LogicalCall, attempt: Any, read: float | None, request: Any) -> Any:
        done, _ = concurrent.futures.wait([attempt], timeout=read)
        if not done:
            turn = self.book.left_running(call, attempt)
            timer = threading.Timer(self._settings.grace, self._expire, (call, turn))
            timer.daemon = True
            timer.start()
            raise self._h.ReadTimeout(
                "no response headers within the read timeout (the attempt keeps running "
                "for the SDK's retry)",
                request=request,
            )
        exc = _error_of(attempt)
        if exc is not None:
            if isinstance(exc, self._h.TransportError):
                self.book.failed(call, attempt_outcome(self._h, exc))
            else:
                self.book.settled(call)
            raise exc  # the attempt's own error, to the SDK
        self.book.settled(call)
        response = attempt.result()
        self.book.answered(str(request.url), response.headers)
        return self._answer(response, request)

    def _answer(self, response: Any, request: Any) -> Any:
        verdict = should_retry_header(response.status_code, response.headers)
        if verdict is not None:
            response.headers["x-should-retry"] = verdict
        if is_resumable(response.status_code, response.headers):
            resume = StreamResume(
                self._settings.streaming, self._settings.clock, self._settings.rand
            )
            response.stream = _resuming_stream(self, request, response.stream, resume)
        return response

    def _expire(self, call: LogicalCall, turn: int) -> None:
        attempt = self.book.expire(call, turn)
        if attempt is None:
            return
        log.info("no retry came for %s: its attempt is closed", call.key)
        attempt.add_done_callback(_close_answer)

    def reconnect(self, request: Any, extra: dict[str, str]) -> Any:
        """A resume of ``request``: the same request with ``extra`` headers; its stream."""
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in extra]
        again = self._h.Request(
            request.method,
            request.url,
            headers=headers + list(extra.items()),
            content=request.content,
            extensions=request.extensions,
        )
        response = self._inner.handle_request(again)
        if not is_resumable(response.status_code, response.headers):
            response.close()
            raise self._h.RemoteProtocolError(
                f"a resume was answered {response.status_code} without a resumable stream",
                request=again,
            )
        return response.stream

    def close(self) -> None:
        """Close the inner transport's connections."""
        self._inner.close()


def _error_of(attempt: concurrent.futures.Future[Any]) -> BaseException | None:
    return attempt.exception()


def _close_answer(attempt: concurrent.futures.Future[Any]) -> None:
    if not attempt.cancelled() and attempt.exception() is None:
        attempt.result().close()


def _resuming_stream(shell: SyncShell, request: Any, stream: Any, resume: StreamResume) -> Any:
    return _stream_class(shell._h)(shell, request, stream, resume)


@functools.cache
def _stream_class(h: Any) -> Any:
    """The resuming stream class for the package ``h`` (built once per package)."""

    class ResumingStream(h.SyncByteStream):  # type: ignore[misc]
        def __init__(
            self, shell: SyncShell, request: Any, stream: Any, resume: StreamResume
        ) -> None:
            self.shell, self.request, self.resume = shell, request, resume
            self.current: Any = stream

        def __iter__(self) -> Iterator[bytes]:
            while True:
                failure: BaseException | None = None
                try:
                    if self.current is None:
                        extra = self.resume.restart()
                        self.current = self.shell.reconnect(self.request, extra)
                    for raw in self.current:
                        out = self.resume.feed(raw)
                        if out:
                            yield out
                    if self.resume.ended():
                        return
                except h.TransportError as exc:
                    failure = exc
                except SSEError as exc:
                    raise h.DecodingError(
                        f"unreadable event stream: {exc}", request=self.request
                    ) from exc
                finally:
                    if self.current is not None:
                        self.current.close()
                    self.current = None
                decision = self.resume.after_break(failure)
                if not decision.resume:
                    if failure is not None:
                        raise failure
                    return
                time.sleep(decision.delay)

        def close(self) -> None:
            if self.current is not None:
                self.current.close()

    return ResumingStream
