"""The asynchronous transport: what :func:`streamsafe.async_http_client` puts under an SDK's
async client (asyncio).

The twin of ``_sync_transport`` with a task where that has a thread: each attempt is a task the
SDK's coroutine waits on as long as its read timeout allows; a retry waits on the same task.
A task nobody claims within the grace is cancelled, which closes its connection (vLLM aborts the
request), and so is one whose caller was cancelled while waiting.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
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

__all__ = ["AsyncShell"]

log = logging.getLogger("streamsafe.sdk")


class AsyncShell:
    """The body of the asynchronous transport class (mixed with the package's
    ``AsyncBaseTransport``); ``inner`` is the package's own ``AsyncHTTPTransport``."""

    def __init__(self, package: Any, inner: Any, settings: TransportSettings) -> None:
        self._h = package
        self._inner = inner
        self._settings = settings
        self.book = CallBook()
        self._tasks: set[asyncio.Task[Any]] = set()  # attempts and closes this transport owns

    async def handle_async_request(self, request: Any) -> Any:
        """Send ``request`` as the attempt of its logical call, or wait on the attempt of it
        already running (see the module)."""
        body = await request.aread()
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
        return await self._wait(call, attempt, timeouts.get("read"), request)

    def _own(self, task: asyncio.Task[Any]) -> asyncio.Task[Any]:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _start(self, call: LogicalCall, request: Any, timeouts: dict[str, Any]) -> Any:
        # As in the synchronous twin: the headers may take up to patience, the body's reads
        # get the SDK's own limit.
        ext = {**timeouts, "read": self._settings.patience}
        request.extensions = {**request.extensions, "timeout": ext}
        call.sent += 1

        async def run() -> Any:
            response = await self._inner.handle_async_request(request)
            ext["read"] = timeouts.get("read")
            return response

        return self._own(asyncio.create_task(run(), name="streamsafe-attempt"))

    async def _wait(
        self, call: LogicalCall, attempt: asyncio.Task[Any], read: float | None, request: Any
    ) -> Any:
        try:
            done, _ = await asyncio.wait({attempt}, timeout=read)
        except asyncio.CancelledError:
            # The caller gave the call up: nobody will read this attempt.
            self.book.settled(call)
            attempt.cancel()
            raise
        if not done:
            turn = self.book.left_running(call, attempt)
            asyncio.get_running_loop().call_later(self._settings.grace, self._expire, call, turn)
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
        if not attempt.done():
            attempt.cancel()  # closes its connection: the engine aborts the request
        elif not attempt.cancelled() and attempt.exception() is None:
            self._own(asyncio.create_task(attempt.result().aclose()))

    async def reconnect(self, request: Any, extra: dict[str, str]) -> Any:
        """A resume of ``request``: the same request with ``extra`` headers; its stream."""
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in extra]
        again = self._h.Request(
            request.method,
            request.url,
            headers=headers + list(extra.items()),
            content=request.content,
            extensions=request.extensions,
        )
        response = await self._inner.handle_async_request(again)
        if not is_resumable(response.status_code, response.headers):
            await response.aclose()
            raise self._h.RemoteProtocolError(
                f"a resume was answered {response.status_code} without a resumable stream",
                request=again,
            )
        return response.stream

    async def aclose(self) -> None:
        """Cancel the attempts still running and close the inner transport's connections."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._inner.aclose()


def _error_of(attempt: asyncio.Task[Any]) -> BaseException | None:
    if attempt.cancelled():  # its transport was closed under it
        return asyncio.CancelledError("the attempt was cancelled: its transport was closed")
    return attempt.exception()


def _resuming_stream(shell: AsyncShell, request: Any, stream: Any, resume: StreamResume) -> Any:
    return _stream_class(shell._h)(shell, request, stream, resume)


@functools.cache
def _stream_class(h: Any) -> Any:
    """The resuming stream class for the package ``h`` (built once per package)."""

    class ResumingStream(h.AsyncByteStream):  # type: ignore[misc]
        def __init__(
            self, shell: AsyncShell, request: Any, stream: Any, resume: StreamResume
        ) -> None:
            self.shell, self.request, self.resume = shell, request, resume
            self.current: Any = stream

        async def __aiter__(self) -> AsyncIterator[bytes]:
            while True:
                failure: BaseException | None = None
                try:
                    if self.current is None:
                        extra = self.resume.restart()
                        self.current = await self.shell.reconnect(self.request, extra)
                    async for raw in self.current:
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
                        await self.current.aclose()
                    self.current = None
                decision = self.resume.after_break(failure)
                if not decision.resume:
                    if failure is not None:
                        raise failure
                    return
                await asyncio.sleep(decision.delay)

        async def aclose(self) -> None:
            if self.current is not None:
                await self.current.aclose()

    return ResumingStream
