"""One Server-Sent Events codec for every part of streamsafe.

Sans-I/O, in the manner of h11: :class:`SSEDecoder` is fed bytes as they arrive from the network
and hands back complete events; :func:`encode_event` turns an event back into bytes. Nothing here
touches a socket, a clock or a thread.

The decoder follows the WHATWG event-stream rules
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):

- lines end with LF, CR or CRLF, and any of them may be split across network chunks;
- a leading UTF-8 byte order mark is skipped once;
- ``data`` lines accumulate (joined with LF), ``event`` sets the type, ``id`` sets the last event
  id (which persists across events; an id containing NUL is ignored), ``retry`` sets the
  reconnection time when it is all ASCII digits; lines starting with ``:`` are comments;
  unknown fields are ignored; a single space after the colon is dropped;
- a blank line dispatches the event, but only if some ``data`` line was seen;
- an incomplete event at the end of the stream is discarded.

It is the hot path of the client and the gateway, so the common case (LF-only ``data:`` lines)
costs one ``bytes.split`` per network chunk and no per-event decoding: an event keeps its payload
as bytes (:attr:`ServerSentEvent.raw`), which ``orjson`` parses directly and the gateway relays
without re-encoding. ``str`` is produced only when :attr:`ServerSentEvent.data` is asked for.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence

from streamsafe._errors import StreamsafeError

__all__ = [
    "DONE",
    "DONE_EVENT",
    "SSEDecoder",
    "SSEError",
    "ServerSentEvent",
    "aiter_events",
    "encode_comment",
    "encode_event",
    "encode_events",
    "iter_events",
]

_BOM = b"\xef\xbb\xbf"
_DONE = b"[DONE]"

#: The payload that ends an OpenAI-style stream.
DONE = _DONE
#: The whole ``data: [DONE]`` event, ready to write (what :func:`encode_event` gives for it).
DONE_EVENT = b"data: [DONE]\n\n"

#: Default bound on one line (and so on one partial line held between chunks): a peer that never
#: sends a newline must not make the decoder grow without limit.
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024


class SSEError(StreamsafeError, ValueError):
    """The byte stream is not a valid event stream (a line over the limit, a payload that is
    not UTF-8). The only exception the codec raises on bad input; a branch of the client's
    :class:`~streamsafe.client.errors.StreamsafeError` tree (and a ``ValueError``)."""


class ServerSentEvent:
    """One dispatched event.

    ``raw`` is the payload as bytes (data lines joined with LF); ``data`` is the same as ``str``.
    ``event`` is the event type (``None`` means the default, ``message``); ``id`` is the last
    event id in force when the event was dispatched (``None`` if the stream never set one);
    ``retry`` is the reconnection time in milliseconds if this event carried one.
    """

    __slots__ = ("event", "id", "raw", "retry")

    def __init__(
        self,
        raw: bytes,
        event: str | None = None,
        id: str | None = None,
        retry: int | None = None,
    ) -> None:
        self.raw = raw
        self.event = event
        self.id = id
        self.retry = retry

    @property
    def data(self) -> str:
        """The payload as text. Raises :class:`SSEError` if it is not UTF-8."""
        try:
            return self.raw.decode()
        except UnicodeDecodeError as exc:
            raise SSEError(f"event data is not valid UTF-8: {exc}") from None

    @property
    def is_done(self) -> bool:
        """True for the ``[DONE]`` sentinel that ends an OpenAI-style stream."""
        return self.raw == _DONE

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ServerSentEvent):
            return NotImplemented
        return (self.raw, self.event, self.id, self.retry) == (
            other.raw,
            other.event,
            other.id,
            other.retry,
        )

    def __hash__(self) -> int:
        return hash((self.raw, self.event, self.id, self.retry))

    def __repr__(self) -> str:
        return (
            f"ServerSentEvent(raw={self.raw!r}, event={self.event!r}, id={self.id!r}, "
            f"retry={self.retry!r})"
        )


class SSEDecoder:
    """Incremental event-stream decoder: ``feed(bytes) -> list[ServerSentEvent]``.

    ``last_event_id`` is the id to send as ``Last-Event-ID`` when reconnecting; ``retry`` is the
    latest reconnection time the server asked for (milliseconds), or ``None``.
    ``max_line_bytes`` (default 16 MiB) bounds one line; past it :class:`SSEError` is raised.
    """

    __slots__ = (
        "_at_start",
        "_data",
        "_event",
        "_max_line",
        "_partial",
        "_retry_field",
        "_skip_lf",
        "last_event_id",
        "retry",
    )

    def __init__(self, *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self._max_line = max_line_bytes
        self._partial = b""
        self._skip_lf = False
        self._at_start = True
        self._data: list[bytes] = []
        self._event: str | None = None
        self._retry_field: int | None = None
        self.last_event_id: str | None = None
        self.retry: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Take the next bytes of the stream; return the events they complete (often none)."""
        # Long because every read of every stream (client and gateway) comes through here: the
        # fast paths and the line loop stay in one frame, with no call per line.
        if not chunk:
            return []
        if (
            # Fast paths: exactly one event in this read, nothing held over: "data: ...\n\n"
            # (vLLM flushes one per token) or "id: n\ndata: ...\n\n" (the gateway's).
            chunk.endswith(b"\n\n")
            and not self._partial
            and not self._data
            and self._event is None
            and self._retry_field is None
            and b"\r" not in chunk
        ):
            end = len(chunk) - 2
            if chunk.startswith(b"data: ") and chunk.find(b"\n") == end:
                self._at_start = self._skip_lf = False
                return [ServerSentEvent(chunk[6:-2], None, self.last_event_id, None)]
            if chunk.startswith(b"id: "):
                nl = chunk.find(b"\n")
                if chunk.startswith(b"data: ", nl + 1) and chunk.find(b"\n", nl + 1) == end:
                    self._at_start = self._skip_lf = False
                    ident = chunk[4:nl]
                    if b"\0" not in ident:
                        self.last_event_id = _text(ident)
                    return [ServerSentEvent(chunk[nl + 7 : -2], None, self.last_event_id, None)]
        if self._partial:
            chunk = self._partial + chunk
            self._partial = b""
        if self._at_start:
            if len(chunk) < 3 and _BOM.startswith(chunk):
                self._partial = chunk
                return []
            self._at_start = False
            if chunk.startswith(_BOM):
                chunk = chunk[3:]
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if b"\r" in chunk:
            # Rare: normalise CRLF and lone CR to LF. A CR at the very end may be the first half
            # of a CRLF split across chunks; remember to drop a LF that starts the next chunk.
            if chunk[-1:] == b"\r":
                self._skip_lf = True
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = chunk.split(b"\n")
        tail = lines.pop()
        if tail:
            if len(tail) > self._max_line:
                raise SSEError(f"line longer than {self._max_line} bytes")
            self._partial = tail
        if not lines:
            return []
        events: list[ServerSentEvent] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    events.append(
                        ServerSentEvent(
                            data[0] if len(data) == 1 else b"\n".join(data),
                            self._event,
                            self.last_event_id,
                            self._retry_field,
                        )
                    )
                    data.clear()
                self._event = None
                self._retry_field = None
            elif line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif line.startswith(b"id:"):  # every event of the gateway's streams
                value = line[4:] if line[3:4] == b" " else line[3:]
                if b"\0" not in value:
                    self.last_event_id = _text(value)
            elif line[0] != 58:  # ":" starts a comment
                self._field(line)
        return events

    def one_payload(self, chunk: bytes) -> bytes | None:
        """The payload of ``chunk`` where it is exactly one ``data: ...`` event and nothing is
        held from earlier reads (the usual read of a token stream), else ``None``, with the
        decoder untouched: the caller then feeds the chunk as usual. The gateway's relay takes
        this shortcut on every read before anything else."""
        # Integer forms (a byte's value, memchr for a byte) cost half of their bytes forms, and
        # this runs on every read: the first LF is the second last byte and the last is one too.
        end = len(chunk) - 2
        if (
            chunk.find(10) == end
            and chunk[-1] == 10
            and chunk[:6] == b"data: "
            and 13 not in chunk
            and not self._at_start
            and not self._partial
            and not self._data
            and self._event is None
            and self._retry_field is None
        ):
            self._skip_lf = False
            return chunk[6:end]
        return None

    def payloads(self, chunk: bytes) -> list[bytes]:
        """:meth:`feed`, for a reader that needs only each event's payload (the gateway's relay,
        once per upstream read): the usual reads, one or more whole ``data: ...`` events with
        nothing held over, are split in C with no event object per payload."""
        if (
            chunk.endswith(b"\n\n")
            and not self._partial
            and not self._data
            and self._event is None
            and self._retry_field is None
            and chunk.startswith(b"data: ")
            and b"\r" not in chunk
        ):
            end = len(chunk) - 2
            if chunk.find(b"\n") == end:  # one event: vLLM flushes one per token
                self._at_start = self._skip_lf = False
                return [chunk[6:end]]
            parts = chunk[:end].split(b"\n\n")
            for part in parts:
                if not part.startswith(b"data: ") or b"\n" in part:
                    break
            else:
                self._at_start = self._skip_lf = False
                return [part[6:] for part in parts]
        return [event.raw for event in self.feed(chunk)]

    def _field(self, line: bytes) -> None:
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":  # "data" with no colon
            self._data.append(value)
        elif name == b"id":
            if b"\0" not in value:
                self.last_event_id = _text(value)
        elif name == b"event":
            self._event = _text(value)
        elif name == b"retry" and value.isdigit():
            self._retry_field = self.retry = int(value)

    def close(self) -> None:
        """End of stream: an incomplete event is discarded, as the WHATWG rules say."""
        self._partial = b""
        self._data.clear()
        self._event = None
        self._retry_field = None

    @property
    def pending(self) -> bool:
        """True if bytes of an undispatched event are held (the stream stopped mid-event)."""
        return bool(self._partial or self._data)


def _text(value: bytes) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError as exc:
        raise SSEError(f"field is not valid UTF-8: {exc}") from None


def iter_events(
    chunks: Iterable[bytes], decoder: SSEDecoder | None = None
) -> Iterator[ServerSentEvent]:
    """Decode an iterable of byte chunks into events."""
    dec = decoder or SSEDecoder()
    for chunk in chunks:
        yield from dec.feed(chunk)
    dec.close()


async def aiter_events(
    chunks: AsyncIterable[bytes], decoder: SSEDecoder | None = None
) -> AsyncIterator[ServerSentEvent]:
    """Decode an async iterable of byte chunks into events."""
    dec = decoder or SSEDecoder()
    async for chunk in chunks:
        for event in dec.feed(chunk):
            yield event
    dec.close()


def _split_lines(value: bytes) -> list[bytes]:
    if b"\r" in value:
        value = value.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return value.split(b"\n")


def encode_event(
    data: bytes | str,
    *,
    event: str | None = None,
    id: str | int | None = None,
    retry: int | None = None,
) -> bytes:
    """Encode one event: the one place an event's bytes are written (:func:`encode_events`
    frames a batch with ids, fast for single-line payloads). Multi-line data becomes several
    ``data:`` lines (CR and CRLF inside the data come back as LF). ``event`` and ``id`` must be
    single lines; an ``id`` must not contain NUL (a decoder would ignore it)."""
    raw = data.encode() if isinstance(data, str) else data
    if event is None and id is None and retry is None and b"\n" not in raw and b"\r" not in raw:
        return b"data: %s\n\n" % raw  # the usual event: one data line
    out = bytearray()
    if event is not None:
        if "\n" in event or "\r" in event:
            raise ValueError("event type must be a single line")
        out += b"event: " + event.encode() + b"\n"
    if id is not None:
        ident = str(id)
        if "\n" in ident or "\r" in ident or "\0" in ident:
            raise ValueError("event id must be a single line without NUL")
        out += b"id: " + ident.encode() + b"\n"
    if retry is not None:
        if retry < 0:
            raise ValueError("retry must be >= 0")
        out += b"retry: %d\n" % retry
    if b"\n" in raw or b"\r" in raw:
        for line in _split_lines(raw):
            out += b"data: " + line + b"\n"
    else:
        out += b"data: " + raw + b"\n"
    out += b"\n"
    return bytes(out)


def encode_events(payloads: Sequence[bytes], first_id: int, multiline: bool = True) -> bytes:
    """Encode ``payloads`` as events with ids ``first_id, first_id + 1, ...`` (a stream that can
    be resumed with ``Last-Event-ID``). ``multiline=False`` promises that no payload holds CR or
    LF, which takes the fast path: one ``%`` format per event and no checks, since this runs once
    per relayed chunk."""
    if not multiline:
        if len(payloads) == 1:  # the usual case: a subscriber that keeps up, one event per wake
            return b"id: %d\ndata: %s\n\n" % (first_id, payloads[0])
        return b"".join(
            [b"id: %d\ndata: %s\n\n" % (i, p) for i, p in enumerate(payloads, first_id)]
        )
    return b"".join([encode_event(p, id=i) for i, p in enumerate(payloads, first_id)])


def encode_comment(text: str = "") -> bytes:
    """Encode a comment (``: text``), the usual keep-alive. Ignored by every SSE client."""
    if "\n" in text or "\r" in text:
        raise ValueError("a comment must be a single line")
    return b": " + text.encode() + b"\n\n"
