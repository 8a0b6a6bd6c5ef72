"""What the relay does with each network read of an upstream stream, in the connection's read
callback (see :mod:`streamsafe.gateway.upstream.exchange`): check the payloads, append them to
the generation's log and publish them (written at once to the subscribers that keep up, see
:mod:`streamsafe.gateway.generations.fanout`), with no task switch per chunk. One path whatever
the log's role: a log shared with other replicas takes the payloads as one of this process's
alone does, and writes them to the shared store behind (see
:meth:`~streamsafe.gateway.generations.store.EventLog.write_behind`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from streamsafe.gateway.engines.attempts import Attempts
from streamsafe.gateway.engines.failover import refusal_status
from streamsafe.gateway.errors import ERROR_PREFIXES
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.owner import Owner
from streamsafe.gateway.generations.response_ids import note_first_event
from streamsafe.gateway.metrics.counters import Counters
from streamsafe.gateway.relay.attempt_watch import AttemptWatch
from streamsafe.gateway.relay.continuation import is_role_chunk, whole_usage
from streamsafe.gateway.upstream.connection import is_engine_death
from streamsafe.gateway.upstream.error_events import parse_error_event
from streamsafe.gateway.upstream.wire import ANTHROPIC_ERROR_PREFIXES, Wire
from streamsafe.sse import DONE

__all__ = ["StreamSink"]

_RUNNING, _QUEUED = State.RUNNING, State.QUEUED


class StreamSink:
    """What the relay does with each network read of a stream, called from the connection's
    read callback (or, with an engine pool, by the task reading the response): check the
    payloads (error events and the engine's death or failure they stand for, reported to the
    generation's ``attempts``; a malformed chunk, multi-line data, a continued answer's usage),
    append them and wake the subscribers, right there, with no task switch. A log shared with
    other replicas holds them until the shared store took them: the reader task publishes
    them then (:meth:`written`), in order.

    A stream that ends with ``[DONE]`` is finished here; one whose upstream sends none (Llama
    Stack) is ended by the stream reader once the body is complete, from :attr:`last`."""

    __slots__ = (
        "_answer_at",
        "_append_now",
        "_append_one",
        "_attempts",
        "_counters",
        "_errors",
        "_owner",
        "_preamble",
        "_repeated",
        "_stop",
        "_watch",
        "diverged",
        "done",
        "errored",
        "gen",
        "last",
        "malformed",
        "refusal",
        "rewrite",
        "skip_role",
        "tokens_before",
    )

    def __init__(
        self,
        gen: Generation,
        watch: AttemptWatch,
        continuing: bool,
        *,
        stop: Callable[[], None],
        attempts: Attempts,
        counters: Counters,
        owner: Owner,
    ) -> None:
        self.gen = gen
        self._watch = watch
        self._stop = stop
        self._attempts = attempts
        self._counters = counters
        self._owner = owner
        # A continuation opens with the assistant's role chunk again; the log has it.
        self.skip_role = continuing
        ask = gen.continuation if continuing else None
        self.tokens_before = ask.tokens_before if ask is not None else 0
        #: What a continuation's reads go through (reshaped from a completion by ids, or
        #: replayed and verified); dropped once every later read passes unchanged.
        self.rewrite = ask.rewrite if ask is not None else None
        #: Why a replayed answer differs from the one delivered: the attempt stopped there, and
        #: the stream ends with that error.
        self.diverged: str | None = None
        self._append_now = gen.log.append_nowait
        self._append_one = gen.log.append_one
        route = gen.request.route
        #: How an error event starts in this route's stream.
        self._errors = ERROR_PREFIXES
        if route is not None and route.wire is Wire.ANTHROPIC_MESSAGES:
            self._errors = ANTHROPIC_ERROR_PREFIXES
            # Its events are framed with names (see generations/framing.py): never by the
            # one-chunk path, which writes OpenAI's framing.
            self._append_one = _never_one
        # Events before the engine's first token (Llama Stack's start event) do not end the
        # first-token wait.
        self._preamble = route.preamble if route is not None else 0
        # An attempt asked again after the log got only those events sends them again: the
        # log has them. They come before the first token, so never through :meth:`one`
        # (which takes only a flowing stream's reads).
        self._repeated = gen.length if continuing and gen.length <= self._preamble else 0
        # The log's length where this attempt's answer starts: an error event there, before any
        # token of it, may be a refusal (see :attr:`refusal`).
        self._answer_at = max(gen.length if continuing else 0, self._preamble)
        #: The status and body of an error event that came before any token of this attempt
        #: and refuses it (:func:`~streamsafe.gateway.engines.failover.refusal_status`: vLLM's load
        #: shedding answers 200, then such an event): never appended; the attempt stopped
        #: there, to be taken as that status.
        self.refusal: tuple[int, bytes] | None = None
        self.errored = False
        #: The last payload appended (how a stream without ``[DONE]`` is told whole).
        self.last = b""
        self.done = False  # [DONE] seen
        #: A chunk that is no JSON object came: the attempt stopped before it.
        self.malformed = False

    def events(self, payloads: list[bytes]) -> None:
        """Take one read's payloads from the attempt into the generation's log, where they pass."""
        # Long because it runs once per upstream read, for every token: the checks stay in one
        # frame, with no call per chunk (a helper per step costs the hot path measurably).
        gen = self.gen
        state = gen.state  # not gen.finished: a property call, once per read
        if (
            self.done
            or self.malformed
            or self.refusal is not None
            or (state is not _RUNNING and state is not _QUEUED)
        ):
            return
        rewrite = self.rewrite
        if rewrite is not None:
            payloads[:] = rewrite(payloads)
            if rewrite.diverged is not None:
                self.diverged = rewrite.diverged
                self._stop()  # the engine aborts the rest; the stream ends with the error
                return
            if rewrite.passed:
                self.rewrite = None  # the usual path (and its fast one) from here on
            if not payloads:
                self._watch.working()  # the engine replays what was delivered: it works
                return
        if self.skip_role:
            self.skip_role = False
            if is_role_chunk(payloads[0]):
                del payloads[0]
                if not payloads:
                    return
        if self._repeated:
            n = min(self._repeated, len(payloads))
            del payloads[:n]
            self._repeated -= n
            if not payloads:
                return
        malformed = None
        errors = self._errors
        for i, p in enumerate(payloads):
            if p.startswith(errors):
                if gen.length + i <= self._answer_at and not self._watch.flowing:
                    refusal = self._refusal(p)
                    if refusal is not None:
                        self.refusal = (refusal, p)
                        del payloads[i:]
                        self._stop()  # the engine did nothing; its [DONE] is not relayed
                        break
                self.errored = True
                attempts = self._attempts
                if is_engine_death(p):
                    attempts.engine_died("error event")
                else:
                    # The engine of this attempt (each one in a pool is probed on its own).
                    error = parse_error_event(attempts.upstream.kind, p)
                    if error is not None and error.upstream_failure:
                        self._counters.upstream_failures += 1
                        attempts.failed(f"error event {error.status}")
            elif p[:1] != b"{" or p[-1:] != b"}":
                # Not a JSON object: a chunk cut off or garbled, never relayed (a check of its
                # ends only: parsing every chunk would cost the hot path).
                if p != DONE:
                    malformed = i
                    break
            elif b"\n" in p:
                gen.multiline = True
            elif self.tokens_before and b'"usage"' in p:
                payloads[i] = whole_usage(p, self.tokens_before)
        if malformed is not None:
            del payloads[malformed:]
            self.malformed = True
            self._stop()  # the rest of this attempt is not relayed; the engine aborts it
        if not payloads:
            return
        self.last = payloads[-1]
        self.done = self.last == DONE
        length = self._append_now(payloads)
        if length:  # readable here now (else once the shared store took them: written)
            gen.appended(length)
            self._appended(payloads)

    def _refusal(self, payload: bytes) -> int | None:
        """The status an error event before any token refuses the attempt with, if it does."""
        error = parse_error_event(self._attempts.upstream.kind, payload)
        return None if error is None else refusal_status(payload, error.status)

    def take_one(self, payload: bytes) -> bool:
        """Take the usual read, one plain chunk of an answer already flowing (what
        :meth:`~streamsafe.sse.SSEDecoder.one_payload` found), with only the checks it needs:
        not an error event, a JSON object, nothing to mend (a continuation's role chunk or
        usage), the log cheap to append to
        (:attr:`~streamsafe.gateway.generations.store.EventLog.append_one`). Return ``False``,
        having done nothing, where :meth:`events` must take it instead."""
        gen = self.gen
        if (
            self.done
            or self.malformed
            or self.skip_role
            or self.tokens_before
            or self.rewrite is not None
            or not self._watch.flowing
            or gen.state is not _RUNNING
            or not payload
            or payload[0] != 123  # {
            or payload[-1] != 125  # }
            or payload.startswith(self._errors)
        ):
            return False
        length = self._append_one(payload)
        if not length:
            return False
        self.last = payload
        self._counters.events_relayed += 1
        gen.appended_one(payload, length)  # one line (one_payload saw to it), not [DONE]
        return True

    def written(self, payloads: list[bytes]) -> None:
        """``payloads``, held by a shared log, were written to its store and are readable here
        now (:meth:`~streamsafe.gateway.generations.store.EventLog.write_behind`)."""
        self.gen.appended(self.gen.log.length)
        self._appended(payloads)

    def _appended(self, payloads: list[bytes]) -> None:
        gen = self.gen
        n = len(payloads)
        self._counters.events_relayed += n
        if gen.length == n:  # the log's first events: a Responses stream's id is in them
            note_first_event(gen, payloads)
        gen.publish(payloads, gen.length - n)
        watch = self._watch
        if not watch.flowing and gen.length > self._preamble:
            watch.first_event()
            if not self.errored:  # an error event first is no sign the engine works
                self._attempts.first_token_came()  # the engine delivered: its breaker closes
            if gen.first_event_at is None:
                gen.first_event_at = time.monotonic()
        # The batch that ends the stream (a shared log may publish one held before it while
        # [DONE] waits for the store).
        if self.done and payloads[-1] == DONE:
            if not self.errored:
                self._attempts.answered_whole()
            self._owner.end(gen, State.FAILED if self.errored else State.DONE)


def _never_one(payload: bytes) -> int:
    """A route whose events are framed with names takes no payload by the one-chunk path."""
    return 0
