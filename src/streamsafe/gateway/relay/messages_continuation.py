"""Continuing a cut stream of Anthropic's Messages API (see docs/gateway.md, Messages).

vLLM's ``/v1/messages`` gives neither token ids (no ``return_token_ids``) nor a prefill: a
trailing assistant message is rendered as a finished turn with a new generation prompt after
it (vLLM sets ``add_generation_prompt`` itself; a request cannot turn it off), so the partial
answer cannot be handed back to be continued, by ids or by text. What a deterministic request
(greedy: ``temperature`` 0) can be given instead is its answer again: the same request, whose
answer is the same tokens, with what the caller already has skipped (:class:`SkipDelivered`).
The engine computes the delivered tokens again (their prefill is served from its prefix cache;
their decoding is the cost), and the caller sees one stream: one ``message_start``, each block
started and stopped once, the text exact, and ``message_delta``'s usage the whole answer's (the
second run counts every token of it). Where the second answer does not begin with what was
delivered (a sampled request is never asked; a greedy one could differ only by the engine's
batch nondeterminism), the stream ends with an error event, never a spliced answer.

A sampled request is not continued: its cut stream ends with an error event.
The log is parsed only when a stream breaks, and a continuation's chunks only while it skips.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from streamsafe.gateway.generations.request import Continuation, GenerationRequest
from streamsafe.gateway.generations.store import EventLog
from streamsafe.gateway.upstream.wire import ANTHROPIC_ERROR_PREFIXES
from streamsafe.sse import DONE

__all__ = [
    "MessagesPartial",
    "SkipDelivered",
    "messages_continuation",
    "messages_owed_end",
    "read_messages_partial",
]

#: The fields of a content block delta that carry its content, by delta type.
_DELTA_TEXT = {
    "text_delta": "text",
    "input_json_delta": "partial_json",
    "thinking_delta": "thinking",
}
_MESSAGE_STOP = b'{"type":"message_stop"}'


@dataclass(slots=True)
class MessagesPartial:
    """What a cut Messages stream delivered: each block's content so far (by index), the blocks
    started and stopped, and whether ``message_delta`` (the stop reason and usage) came, after
    which only ``message_stop`` was missing."""

    texts: dict[int, str] = field(default_factory=dict)
    started: set[int] = field(default_factory=set)
    stopped: set[int] = field(default_factory=set)
    finished: bool = False


def _delta_text(delta: object) -> str | None:
    if not isinstance(delta, dict):
        return None
    name = _DELTA_TEXT.get(str(delta.get("type")))
    value = delta.get(name) if name is not None else None
    return value if isinstance(value, str) else None


async def read_messages_partial(log: EventLog) -> MessagesPartial | None:
    """The partial answer in ``log``, or ``None`` where it cannot be continued (an error event,
    an unparsable one)."""
    partial = MessagesPartial()
    for payload in await log.read(0):
        if payload == DONE or payload.startswith(ANTHROPIC_ERROR_PREFIXES):
            return None
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(event, dict):
            return None
        kind = event.get("type")
        index = event.get("index")
        if kind == "content_block_start" and isinstance(index, int):
            partial.started.add(index)
            partial.texts.setdefault(index, "")
        elif kind == "content_block_delta" and isinstance(index, int):
            text = _delta_text(event.get("delta"))
            if text is not None:
                partial.texts[index] = partial.texts.get(index, "") + text
        elif kind == "content_block_stop" and isinstance(index, int):
            partial.stopped.add(index)
        elif kind == "message_delta":
            partial.finished = True
    return partial


def messages_continuation(req: GenerationRequest, partial: MessagesPartial) -> Continuation | str:
    """The request that continues ``partial``: the same request again, its repeated part
    skipped, for a deterministic request; for a sampled one, why it cannot be continued."""
    if not req.deterministic:
        return "a sampled Messages answer (vLLM's Messages route gives no token ids to go on from)"
    return Continuation(req.path, req.body, 0, SkipDelivered(partial))


def messages_owed_end(partial: MessagesPartial) -> tuple[bytes, ...]:
    """The end a stream owes whose ``message_delta`` came but not its ``message_stop``."""
    return (_MESSAGE_STOP, DONE)


class SkipDelivered:
    """Turns the events of the answer asked again into the rest of the cut one (a
    :class:`~streamsafe.gateway.generations.request.Rewrite`): drops what the caller has
    (``message_start``, the blocks' starts and stops, their content up to what was delivered,
    pings), passes the rest as it comes, a delta that straddles the cut trimmed to its new
    part. An answer that does not begin as the delivered one did sets :attr:`diverged`."""

    __slots__ = ("_left", "_started", "_stopped", "_texts", "diverged")

    #: A block start or stop already sent may come at any point of the replay: every read is
    #: looked at (a delta past the cut without parsing).
    passed = False

    def __init__(self, partial: MessagesPartial) -> None:
        self._texts = dict(partial.texts)
        #: Characters of each block still to skip.
        self._left = {i: len(t) for i, t in partial.texts.items()}
        self._started = set(partial.started)
        self._stopped = set(partial.stopped)
        self.diverged: str | None = None

    def __call__(self, payloads: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        for payload in payloads:
            kept = self._event(payload)
            if self.diverged is not None:
                return out
            if kept:
                out.append(kept)
        return out

    def _event(self, payload: bytes) -> bytes:
        """The event to relay for ``payload`` (``b""``: none)."""
        if payload == DONE or payload.startswith(ANTHROPIC_ERROR_PREFIXES):
            return payload
        if not any(self._left.values()) and payload.startswith(b'{"type":"content_block_delta"'):
            return payload  # past the cut: nothing to parse any more
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return payload  # not relayed: the stream counts as cut there
        if not isinstance(event, dict):
            return payload
        kind, index = event.get("type"), event.get("index")
        if kind in ("message_start", "ping"):
            return b""
        if kind == "content_block_start":
            return b"" if index in self._started else payload
        if kind == "content_block_stop":
            return b"" if index in self._stopped else payload
        if kind == "content_block_delta" and isinstance(index, int):
            return self._delta(payload, event, index)
        return payload

    def _delta(self, payload: bytes, event: dict[str, Any], index: int) -> bytes:
        left = self._left.get(index, 0)
        if not left:
            return payload
        delta = event.get("delta")
        text = _delta_text(delta)
        if text is None:
            return b""
        delivered = self._texts[index]
        at = len(delivered) - left
        if len(text) <= left:
            if delivered[at : at + len(text)] != text:
                return self._diverge(index)
            self._left[index] = left - len(text)
            return b""
        if delivered[at:] != text[:left]:
            return self._diverge(index)
        self._left[index] = 0
        assert isinstance(delta, dict)
        name = _DELTA_TEXT[str(delta.get("type"))]
        return orjson.dumps({**event, "delta": {**delta, name: text[left:]}})

    def _diverge(self, index: int) -> bytes:
        self.diverged = f"the answer asked again differs from what was sent (block {index})"
        return b""
