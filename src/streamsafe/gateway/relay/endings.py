"""How a generation's upstream attempts end: why an attempt broke where another may repair it
(:class:`BrokenAttempt`), and the failures a generation ends with, before any event (a real
status for a caller not yet answered) or after them (an error event and ``[DONE]``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from streamsafe.gateway.engines.attempts import Attempts
from streamsafe.gateway.errors import Failure, error_body, upstream_refusal
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.owner import Owner
from streamsafe.gateway.metrics.counters import Counters
from streamsafe.gateway.relay.attempt_watch import UpstreamStalled
from streamsafe.gateway.upstream.connect_failure import connect_failure
from streamsafe.gateway.upstream.connection import is_engine_death
from streamsafe.retry import REFUSAL_STATUSES, retry_after_seconds
from streamsafe.sse import DONE

__all__ = ["REFUSAL_WAIT", "BrokenAttempt", "GenerationFailer", "dropped"]

log = logging.getLogger("streamsafe.gateway")

#: Seconds before a refusal without ``Retry-After`` is asked again (vLLM sends none): the
#: ``Retry-After`` the gateway itself gives with its own 503s.
REFUSAL_WAIT = 1


@dataclass(slots=True)
class BrokenAttempt:
    """Why an upstream attempt broke where another attempt may repair it: cut or ended early,
    stalled past a deadline, a malformed chunk, dropped before its answer, or a continuation
    refused before any work."""

    why: str
    #: The status a caller not yet answered gets if no attempt repairs it.
    status: int
    #: The upstream's own refusal, where it answered one.
    failure: Failure | None = None
    #: Seconds to wait before asking again (a refusal before any work).
    retry_after: int | None = None
    #: The deadline that passed, for a stall.
    stalled: UpstreamStalled | None = None
    #: Loop time of the attempt's last read where it relayed events (see
    #: :class:`~streamsafe.gateway.relay.repairs.Repair`).
    quiet_since: float | None = None


def dropped(attempts: Attempts, why: str) -> BrokenAttempt:
    """Connected, then closed or reset before any answer: the engine dropped the request (it
    aborts what it loses), so asking again duplicates nothing."""
    msg = f"upstream closed the connection before answering ({why})"
    attempts.failed(msg)
    return BrokenAttempt(msg, 502)


class GenerationFailer:
    """Ends generations that fail, through their ``owner``; ``counters`` count the upstream's
    failures and the breaker's rejections, ``down_for`` says how many seconds a dead engine
    asks its callers to wait (the breaker's, or the pool's shortest)."""

    __slots__ = ("_counters", "_down_for", "_owner")

    def __init__(self, counters: Counters, owner: Owner, down_for: Callable[[], int]) -> None:
        self._counters = counters
        self._owner = owner
        self._down_for = down_for

    async def refused(
        self,
        gen: Generation,
        status: int,
        body: bytes,
        retry_after_header: str | None,
        continuing: bool,
        attempts: Attempts,
        *,
        in_band: bool = False,
    ) -> BrokenAttempt | None:
        """An error status from upstream, with its (bounded) body, or (``in_band``) the status
        an error event before any token refused the attempt with (vLLM's load shedding answers
        200, then such an event). Before any event it is the caller's answer. A refusal before
        any work is asked again after ``Retry-After`` (:data:`REFUSAL_WAIT` where none came)
        instead: a 429 or 503 always (the engine shed it: it is full, and the generation waits
        for room within the relay's bound, as in the gateway's own queue), any other 5xx that is
        not the engine's death where the caller can no longer be told its status (a
        continuation, or a generation whose response already committed). So is one refused
        in-band by an engine of a pool, which the pool's failover did not see (it fails over on
        statuses) where another engine of its model takes traffic: the next attempt goes there."""
        status, body = upstream_refusal(status, body)
        dead = status >= 500 and is_engine_death(body)
        if status >= 500:
            self._counters.upstream_failures += 1
        seconds = retry_after_seconds(retry_after_header, time.time())
        if dead:
            attempts.engine_died(f"upstream {status}")
        elif status in REFUSAL_STATUSES:
            attempts.full(seconds, status)
        elif status >= 500:
            attempts.failed(f"upstream {status}")
        retry_after = None if seconds is None else max(1, math.ceil(seconds))
        if retry_after is None and status in REFUSAL_STATUSES:
            retry_after = REFUSAL_WAIT  # a 429 or 503 always says when to come back
        failure = Failure(status, body, retry_after)
        committed = gen.waiter is not None and gen.waiter.committed
        # An engine that sheds load (429, 503) is full, not failing: the generation waits for
        # room as it would in the gateway's own queue (the relay bounds the wait), whoever has
        # been answered. Other refusals go back to a caller not yet answered.
        shed = status in REFUSAL_STATUSES
        again = shed or continuing or committed or (in_band and attempts.elsewhere())
        if again and not dead and (status == 429 or status >= 500):
            what = "the continuation" if continuing else "the request"
            why = f"upstream refused {what} with {status}" + (" (in-band)" if in_band else "")
            wait = retry_after if retry_after is not None else REFUSAL_WAIT
            return BrokenAttempt(why, status, failure=failure, retry_after=wait)
        await self.fail(gen, failure)
        return None

    async def unreachable(self, gen: Generation, exc: Exception) -> BrokenAttempt | None:
        """No connection to the engine: before any event the caller gets a 503 (retry after a
        second); a stream already under way may still be continued."""
        msg = f"upstream unreachable: {connect_failure(exc)}"
        failure = Failure(503, error_body(msg, "service_unavailable", 503), 1)
        if gen.length:
            return BrokenAttempt(msg, 503, failure=failure)
        await self.fail(gen, failure)
        return None

    async def fail_dead(self, gen: Generation, why: str | None = None) -> None:
        """The breaker is open: the engine is down (``why``, where known: a TLS failure is
        no outage, and the caller is told so)."""
        self._counters.breaker_rejections += 1
        retry_after = self._down_for()
        because = f" ({why})" if why else ""
        msg = f"engine is down{because}; retry after {retry_after} s"
        await self.fail(gen, Failure(503, error_body(msg, "service_unavailable", 503), retry_after))

    async def fail(self, gen: Generation, failure: Failure) -> None:
        """Failure before any event: answered with its real status where not yet committed."""
        if gen.length and gen.stream:
            event = failure.as_event()
            await self._end_stream(gen, event, event.decode("utf-8", "replace"))
            return
        self._owner.end(gen, State.FAILED, failure)

    async def fail_broken(self, gen: Generation, broken: BrokenAttempt) -> None:
        """No attempt left to repair ``broken``: before any event the caller gets a real status
        (the upstream's own refusal where it gave one), after them an error event."""
        if gen.length:
            await self.fail_mid_stream(gen, broken.why, broken.status)
            return
        failure = broken.failure or Failure(
            broken.status, error_body(broken.why, "upstream_error", broken.status)
        )
        await self.fail(gen, failure)

    async def fail_mid_stream(self, gen: Generation, message: str, status: int = 502) -> None:
        """After events went out: end the log with an error event and ``[DONE]`` (vLLM's way).
        A non-streaming generation has no events to follow, so it fails with ``status``
        instead."""
        if gen.stream:
            await self._end_stream(gen, error_body(message, "upstream_error", status), message)
        elif not gen.finished:
            log.info("%s: failed: %s", gen.id, message)
            failure = Failure(status, error_body(message, "upstream_error", status))
            self._owner.end(gen, State.FAILED, failure)

    async def _end_stream(self, gen: Generation, payload: bytes, why: str) -> None:
        """End a stream's log with the error event ``payload`` and ``[DONE]``."""
        if gen.finished:
            return
        log.info("%s: failed mid-stream: %s", gen.id, why)
        gen.appended(await gen.log.append((payload, DONE)))
        self._owner.end(gen, State.FAILED)
