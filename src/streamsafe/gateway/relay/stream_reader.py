"""One attempt of a streaming completion upstream, read on the hot path.

Whatever the number of engines, the attempt goes through the generation's
:class:`~streamsafe.gateway.engines.attempts.Attempts` (one request; where it failed before its
first token and the plan asks again, :class:`~streamsafe.gateway.engines.attempts.AskAgain`
goes back to the relay's loop) and its response is parsed in the connection's read callback
(:mod:`streamsafe.gateway.upstream.exchange`), where each read's events are checked, appended
and the subscribers woken by a :class:`~streamsafe.gateway.relay.stream_sink.StreamSink`, with no
task switch; the reader task only waits for the end.

A stream ends whole with ``[DONE]``, or, where the upstream sends none (Llama Stack), at the end
of the body right after the event that closes an answer; a ``[DONE]`` is then appended to the
log, so every whole stream in a log ends alike. An error event counts as an upstream failure
where it stands for one (Llama Stack's masked 500s).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from streamsafe.gateway.engines.answers import Refused
from streamsafe.gateway.engines.attempts import AskAgain, Attempts
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.owner import Owner
from streamsafe.gateway.metrics.counters import Counters
from streamsafe.gateway.relay.attempt_watch import AttemptWatch
from streamsafe.gateway.relay.endings import BrokenAttempt, GenerationFailer, dropped
from streamsafe.gateway.relay.stream_sink import StreamSink
from streamsafe.gateway.upstream.answer_end import ends_answer
from streamsafe.gateway.upstream.connection import MAX_ERROR_BODY
from streamsafe.gateway.upstream.errors import ConnectFailed, UpstreamClosed, UpstreamError
from streamsafe.gateway.upstream.transport import Response
from streamsafe.sse import DONE

__all__ = ["StreamReader"]

_BROKEN_STREAM = "upstream sent a broken event stream"


class StreamReader:
    """Runs one streaming attempt of a generation and says how it ended: ``None`` where the
    generation ended (done or failed), :class:`AskAgain` where it failed before its first token
    and its plan asks again, else why it broke (see :class:`BrokenAttempt`)."""

    __slots__ = ("_counters", "_endings", "_owner")

    def __init__(self, counters: Counters, owner: Owner, endings: GenerationFailer) -> None:
        self._counters = counters
        self._owner = owner
        self._endings = endings

    async def attempt(
        self,
        gen: Generation,
        path: str,
        body: bytes,
        watch: AttemptWatch,
        continuing: bool,
        attempts: Attempts,
    ) -> BrokenAttempt | AskAgain | None:
        """One attempt, read on the connection's read callback."""
        req = gen.request
        trace = gen.trace
        try:
            opened = await attempts.open_stream(
                path,
                body,
                req.forward + trace.header if trace is not None else req.forward,
                retry_connect=not req.no_upstream_retry,
                on_engine=watch.engine,
            )
        except UpstreamClosed as exc:
            return dropped(attempts, str(exc))
        except OSError as exc:
            return await self._endings.unreachable(gen, exc)
        if isinstance(opened, AskAgain):
            return opened
        if isinstance(opened, Refused):
            gen.upstream_status = opened.status
            return await self._endings.refused(
                gen, opened.status, opened.body, opened.retry_after, continuing, attempts
            )
        conn = opened
        sink = self._sink(gen, watch, continuing, conn.close, attempts)
        try:
            # A 200 alone does not commit early: vLLM refuses in-band too (a first event that is
            # an error carrying 503), which must reach a caller not yet answered as its status.
            watch.follow(conn)
            end = conn.stream_events(sink.events, one=sink.take_one)
            # A shared log writes what it held to its store as the stream goes (one of this
            # process's alone has nothing to write behind).
            async with contextlib.aclosing(gen.log.write_behind(end)) as behind:
                async for written in behind:
                    sink.written(written)
            broke = await end
            return await self._ended(gen, sink, broke, continuing, attempts)
        finally:
            conn.release(finished=sink.done)

    async def open(
        self,
        gen: Generation,
        path: str,
        body: bytes,
        watch: AttemptWatch,
        continuing: bool,
        attempts: Attempts,
    ) -> Response | BrokenAttempt | AskAgain | None:
        """Send a non-streamed request ``body`` to ``path`` through ``attempts``: the accepted
        response, its body unread, for the caller to close; else how the attempt ended (see
        :meth:`attempt`). Its engine's health is asked while it is quiet, as a stream's is (a
        frozen engine must not hold a plain call to the total timeout)."""
        req = gen.request
        try:
            response = await attempts.open(
                "POST",
                path,
                content=body,
                headers=_headers(req.forward + (gen.trace.header if gen.trace else b"")),
                retry_connect=not req.no_upstream_retry,
                on_engine=watch.engine,
            )
        except ConnectFailed as exc:
            return await self._endings.unreachable(gen, exc)
        except UpstreamError as exc:
            return dropped(attempts, type(exc).__name__)
        if isinstance(response, AskAgain):
            return response
        status = response.status
        if status == 200:
            return response
        gen.upstream_status = status
        try:
            error = await response.read_body(MAX_ERROR_BODY, broken_ok=True)
        finally:
            response.release()
        ra = response.header(b"retry-after")
        retry_after = None if ra is None else ra.decode("latin-1")
        return await self._endings.refused(gen, status, error, retry_after, continuing, attempts)

    def _sink(
        self,
        gen: Generation,
        watch: AttemptWatch,
        continuing: bool,
        stop: Callable[[], None],
        attempts: Attempts,
    ) -> StreamSink:
        return StreamSink(
            gen,
            watch,
            continuing,
            stop=stop,
            attempts=attempts,
            counters=self._counters,
            owner=self._owner,
        )

    async def _ended(
        self,
        gen: Generation,
        sink: StreamSink,
        broke: str | None,
        continuing: bool,
        attempts: Attempts,
    ) -> BrokenAttempt | None:
        """How an attempt ended once its body ended or broke (``broke``: why). One whose first
        event refused it (vLLM's load shedding in-band) ends as the status it carries would."""
        if sink.refusal is not None:
            status, error = sink.refusal
            return await self._endings.refused(
                gen, status, error, None, continuing, attempts, in_band=True
            )
        if sink.malformed:
            return BrokenAttempt("upstream sent a malformed chunk", 502)
        if sink.diverged is not None:
            why = f"the stream broke and could not be continued exactly: {sink.diverged}"
            await self._endings.fail_mid_stream(gen, why)
            return None
        if sink.done or gen.finished:
            return None
        route = gen.request.route
        if broke is None and not route.upstream_done:
            # Llama Stack's streams just end: after their last event, or after an error event.
            if sink.errored or ends_answer(route.wire, sink.last):
                gen.appended(await gen.log.append((DONE,)))
                if not sink.errored:
                    attempts.answered_whole()
                self._owner.end(gen, State.FAILED if sink.errored else State.DONE)
                return None
            return BrokenAttempt("upstream stream ended before the answer was complete", 502)
        if sink.errored:
            await self._endings.fail_mid_stream(gen, "upstream stream ended after an error event")
            return None
        if broke is not None and broke.startswith(_BROKEN_STREAM):
            await self._endings.fail_mid_stream(gen, broke)
            return None
        if broke is not None:
            why = f"upstream connection failed: {broke}"
            attempts.failed(why)
            return BrokenAttempt(why, 502)
        return BrokenAttempt("upstream stream ended before [DONE]", 502)


def _headers(forward: bytes) -> dict[str, str]:
    """A non-streamed request's headers: JSON, and the client's own it carries (header lines)."""
    headers = {"content-type": "application/json"}
    for line in forward.decode("latin-1").split("\r\n"):
        name, sep, value = line.partition(": ")
        if sep:
            headers[name] = value
    return headers
