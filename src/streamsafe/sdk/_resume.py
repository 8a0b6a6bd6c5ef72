"""A resumable stream as the SDK reads it: events passed up whole, the last event id kept, and
the retry core asked whether a break is resumed. No I/O: the transports read and reconnect.

Only a stream the server declared resumable (``X-Stream-Resumable: true``, the streamsafe
gateway's promise: ``id:`` on every event, ``Last-Event-ID`` replays from the next one) is
watched; any other stream reaches the SDK byte for byte. A watched stream is handed up one
whole event at a time (keep-alive comments dropped), so a break never leaves half an event in
the SDK's decoder, and the events a resume replays are skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import orjson

from streamsafe.client._answers import finished
from streamsafe.retry import Decision, Outcome, RetryPolicy, StreamingConfig, decide
from streamsafe.sse import SSEDecoder, encode_event

__all__ = ["StreamResume", "is_resumable"]

log = logging.getLogger("streamsafe.sdk")


def is_resumable(status: int, headers: Mapping[str, str]) -> bool:
    """Whether an answer is a stream the server can resume."""
    ctype = headers.get("content-type", "").lower()
    return (
        200 <= status < 300
        and ctype.startswith("text/event-stream")
        and headers.get("x-stream-resumable", "").lower() == "true"
    )


class StreamResume:
    """The state of one resumable stream: what was handed up, and what a break leads to."""

    def __init__(
        self,
        streaming: StreamingConfig,
        clock: Callable[[], float],
        rand: Callable[[], float],
    ) -> None:
        self.streaming = streaming
        self.clock = clock
        self.rand = rand
        self.started_at = clock()
        self.events = 0  # events handed up
        self.resumes = 0
        self.last_event_id: str | None = None
        self._skip_through: int | None = None
        self._decoder = SSEDecoder()
        self._done = False
        self._last: object = None

    def feed(self, raw: bytes) -> bytes:
        """The whole events in ``raw`` (with what came before it), re-encoded; replayed ones
        dropped. Raises :class:`SSEError` for bytes that are no event stream."""
        out = bytearray()
        for ev in self._decoder.feed(raw):
            if ev.id is not None:
                n = _int(ev.id)
                if self._skip_through is not None and n is not None and n <= self._skip_through:
                    continue
                self._skip_through = None
                self.last_event_id = ev.id
            if ev.is_done:
                self._done = True
            else:
                try:
                    self._last = orjson.loads(ev.raw)
                except orjson.JSONDecodeError:
                    self._last = None
            self.events += 1
            out += encode_event(ev.raw, event=ev.event, id=ev.id)
        return bytes(out)

    def ended(self) -> bool:
        """Whether the stream reached its end: ``[DONE]``, a finishing chunk, or a Responses
        API stream's closing event (it sends no ``[DONE]``)."""
        return self._done or (isinstance(self._last, dict) and finished([self._last]))

    def after_break(self, failure: BaseException | None) -> Decision:
        """What follows a break (``failure`` the transport error, ``None`` for an end before
        the stream's own): the retry core's decision, logged."""
        # Without an id the server would replay from the start: only where nothing went up.
        resumable = self.events == 0 or self.last_event_id is not None
        detail = "stream truncated" if failure is None else f"connection lost ({failure!r})"
        outcome = Outcome.broken(events=self.events, resumable=resumable, detail=detail)
        decision = decide(
            RetryPolicy(),
            self.streaming,
            outcome,
            attempt=0,
            resumes=self.resumes,
            budget=None,
            now=self.clock(),
            started_at=self.started_at,
            rand=self.rand(),
        )
        if decision.resume:
            self.resumes += 1
            log.info("resuming in %.2f s, %s", decision.delay, decision.reason)
        else:
            log.info("not resuming: %s", decision.reason)
        return decision

    def restart(self) -> dict[str, str]:
        """A resume is sent: the headers it adds (``Last-Event-ID``); replays are skipped."""
        self._decoder = SSEDecoder()
        self._skip_through = _int(self.last_event_id)
        return {} if self.last_event_id is None else {"last-event-id": self.last_event_id}


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None
