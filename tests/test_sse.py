"""The SSE codec: WHATWG decoding rules, any chunking, encode/decode round trips."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamsafe.sse import (
    DONE_EVENT,
    ServerSentEvent,
    SSEDecoder,
    SSEError,
    encode_comment,
    encode_event,
    iter_events,
)

pytestmark = pytest.mark.unit


def decode_all(stream: bytes, sizes: list[int] | None = None) -> list[ServerSentEvent]:
    """Feed ``stream`` cut into pieces of the given sizes (cycled), then close."""
    dec = SSEDecoder()
    out: list[ServerSentEvent] = []
    if not sizes:
        out += dec.feed(stream)
    else:
        i = k = 0
        while i < len(stream):
            n = max(1, sizes[k % len(sizes)])
            out += dec.feed(stream[i : i + n])
            i += n
            k += 1
    dec.close()
    return out


def test_data_lines_are_joined_with_lf():
    (ev,) = decode_all(b"data: a\ndata: b\n\n")
    assert ev.data == "a\nb"
    assert ev.event is None and ev.id is None and ev.retry is None


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"])
def test_every_line_ending_is_accepted(eol: bytes):
    stream = b"event: e" + eol + b"id: 7" + eol + b"data: x" + eol + eol
    (ev,) = decode_all(stream)
    assert (ev.data, ev.event, ev.id) == ("x", "e", "7")


def test_crlf_split_across_chunks_is_one_line_end():
    dec = SSEDecoder()
    assert dec.feed(b"data: a\r") == []
    assert dec.feed(b"\n\r") == [ServerSentEvent(b"a")]
    # the LF after the second CR belongs to the same CRLF, not a new blank line
    assert dec.feed(b"\ndata: b\r\n\r\n") == [ServerSentEvent(b"b")]


def test_bom_is_skipped_once_even_if_split():
    dec = SSEDecoder()
    assert dec.feed(b"\xef") == []
    assert dec.feed(b"\xbb\xbfdata: a\n\n") == [ServerSentEvent(b"a")]
    # a second BOM is not special: it becomes part of the field name, which is unknown
    assert dec.feed(b"\xef\xbb\xbfdata: b\n\n") == []


def test_comments_and_unknown_fields_are_ignored():
    assert decode_all(b": keep-alive\n\nfoo: bar\n\n") == []
    assert decode_all(b": keep-alive\ndata: x\n\n") == [ServerSentEvent(b"x")]


def test_id_persists_and_nul_id_is_ignored():
    evs = decode_all(b"id: 1\ndata: a\n\ndata: b\n\nid: x\x00y\ndata: c\n\nid\ndata: d\n\n")
    assert [e.id for e in evs] == ["1", "1", "1", ""]


def test_retry_needs_digits_only():
    dec = SSEDecoder()
    evs = dec.feed(b"retry: 1500\ndata: a\n\nretry: 1x\ndata: b\n\n")
    assert [e.retry for e in evs] == [1500, None]
    assert dec.retry == 1500


def test_event_without_data_is_not_dispatched_but_empty_data_is():
    assert decode_all(b"event: e\n\n") == []
    assert decode_all(b"data\n\n") == [ServerSentEvent(b"")]
    assert decode_all(b"data:\n\n") == [ServerSentEvent(b"")]


def test_only_one_leading_space_is_dropped():
    (ev,) = decode_all(b"data:  two\n\n")
    assert ev.data == " two"
    (ev,) = decode_all(b"data:none\n\n")
    assert ev.data == "none"


def test_incomplete_event_at_end_of_stream_is_discarded():
    dec = SSEDecoder()
    assert dec.feed(b"data: a\n\ndata: partial\n") == [ServerSentEvent(b"a")]
    assert dec.pending
    dec.close()
    assert not dec.pending
    assert list(iter_events([b"data: a\n\ndata: b"])) == [ServerSentEvent(b"a")]


def test_done_sentinel():
    (ev,) = decode_all(DONE_EVENT)
    assert ev.is_done
    assert not ServerSentEvent(b'{"x": 1}').is_done


def test_invalid_utf8_raises_codec_error_only_when_read():
    (ev,) = decode_all(b"data: \xff\n\n")
    with pytest.raises(SSEError):
        _ = ev.data
    with pytest.raises(SSEError):
        decode_all(b"event: \xff\ndata: x\n\n")


def test_endless_line_is_bounded():
    dec = SSEDecoder(max_line_bytes=1024)
    dec.feed(b"data: " + b"x" * 1000)
    with pytest.raises(SSEError):
        dec.feed(b"x" * 100)


def test_encoder_writes_fields_and_splits_lines():
    assert encode_event("a\nb", event="e", id=3, retry=10) == (
        b"event: e\nid: 3\nretry: 10\ndata: a\ndata: b\n\n"
    )
    assert encode_event(b"[DONE]") == DONE_EVENT
    assert encode_comment("keep-alive") == b": keep-alive\n\n"
    for bad in ({"event": "a\nb"}, {"id": "a\nb"}, {"id": "a\x00"}, {"retry": -1}):
        with pytest.raises(ValueError):
            encode_event("x", **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        encode_comment("a\nb")


# --- properties -------------------------------------------------------------------------------

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
_line = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x00"), max_size=12
)
_events = st.lists(
    st.tuples(_text, st.none() | _line, st.none() | _line, st.none() | st.integers(0, 10**6)),
    max_size=12,
)


def _normalise(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


@settings(max_examples=300, deadline=None)
@given(events=_events, sizes=st.lists(st.integers(1, 64), min_size=1, max_size=8))
def test_encode_then_decode_gives_the_events_back_whatever_the_chunking(events, sizes):
    stream = b"".join(
        encode_event(data, event=event, id=ident, retry=retry)
        for data, event, ident, retry in events
    )
    got = decode_all(stream, sizes)
    assert len(got) == len(events)
    last_id = None
    for ev, (data, event, ident, retry) in zip(got, events, strict=True):
        last_id = ident if ident is not None else last_id
        assert ev.data == _normalise(data)
        assert ev.event == (event or None) or (event == "" and ev.event == "")
        assert ev.id == last_id
        assert ev.retry == retry


@settings(max_examples=300, deadline=None)
@given(stream=st.binary(max_size=300), sizes=st.lists(st.integers(1, 32), min_size=1, max_size=6))
def test_malformed_input_raises_nothing_but_the_codec_error(stream, sizes):
    try:
        for ev in decode_all(stream, sizes):
            _ = ev.data
    except SSEError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    stream=st.lists(
        st.sampled_from(
            [b"data: a", b"data:b", b"id: 1", b": c", b"event: e", b"", b"retry: 5", b"x"]
        ),
        max_size=20,
    ),
    eol=st.sampled_from([b"\n", b"\r", b"\r\n"]),
    sizes=st.lists(st.integers(1, 7), min_size=1, max_size=5),
)
def test_chunk_boundaries_never_change_the_result(stream, eol, sizes):
    raw = eol.join(stream) + eol
    assert decode_all(raw, sizes) == decode_all(raw)


def test_fields_held_from_an_earlier_read_apply_to_a_whole_event_read():
    dec = SSEDecoder()
    assert dec.feed(b"event: delta\nid: 4\n") == []
    assert dec.feed(b"data: x\n\n") == [ServerSentEvent(b"x", "delta", "4")]
    assert dec.feed(b"data: y\n\n") == [ServerSentEvent(b"y", None, "4")]


def test_whole_event_reads_with_an_id_line_take_the_id():
    dec = SSEDecoder()
    assert dec.feed(b"id: 0\ndata: a\n\n") == [ServerSentEvent(b"a", None, "0")]
    assert dec.feed(b"id:  1\ndata: b\n\n") == [ServerSentEvent(b"b", None, " 1")]
    assert dec.feed(b"id: x\x00\ndata: c\n\n") == [ServerSentEvent(b"c", None, " 1")]
    assert dec.last_event_id == " 1"
    # two data lines are not the single-event shape: the general path joins them
    assert dec.feed(b"id: 2\ndata: d\ndata: e\n\n") == [ServerSentEvent(b"d\ne", None, "2")]


@settings(max_examples=300, deadline=None)
@given(
    reads=st.lists(
        st.lists(
            st.sampled_from(
                [
                    b"data: {}",
                    b"data: a",
                    b"data:b",
                    b"data:  c",
                    b"id: 1",
                    b": c",
                    b"event: e",
                    b"",
                    b"retry: 5",
                    b"data: [DONE]",
                    b"\xef\xbb\xbfdata: x",
                ]
            ),
            max_size=6,
        ).map(lambda lines: b"".join(line + b"\n" for line in lines)),
        max_size=8,
    ),
    eol=st.sampled_from([b"\n", b"\r\n"]),
)
def test_payloads_are_exactly_the_raw_data_of_what_feed_dispatches(reads, eol):
    # The relay's shortcut must give, read by read, what the full decoder gives.
    reads = [r.replace(b"\n", eol) for r in reads] + [b"data: z\n\ndata: y\n\n"]
    fast, full = SSEDecoder(), SSEDecoder()
    for read in reads:
        assert fast.payloads(read) == [ev.raw for ev in full.feed(read)]
        assert fast.pending == full.pending and fast.last_event_id == full.last_event_id


def test_payloads_split_several_whole_events_of_one_read():
    dec = SSEDecoder()
    assert dec.payloads(b"data: {}\n\ndata: [DONE]\n\n") == [b"{}", b"[DONE]"]
    assert dec.payloads(b"data: a\n\n\ndata: b\n\n") == [b"a", b"b"]  # a stray blank line
    assert dec.payloads(b"data: a\ndata: b\n\n") == [b"a\nb"]


_PIECES = st.sampled_from(
    [
        *(b"data: ", b"data:", b"{}", b'{"a":1}', b"x", b"\n", b"\r", b"\r\n", b"\n\n"),
        *(b"id: 3", b": c", b"event: e", b"retry: 5", b"\xef\xbb\xbf"),
    ]
)


_BYTES = st.lists(_PIECES, max_size=8).map(b"".join)
# Reads shaped like the usual one, so that the shortcut's every check is put to the test.
_READS = st.one_of(
    _BYTES,
    st.builds(lambda middle: b"data: " + middle + b"\n\n", _BYTES),
    st.builds(lambda middle, end: b"data: " + middle + end, _BYTES, _BYTES),
)


def _seen(events):
    return [(ev.raw, ev.event, ev.id, ev.retry) for ev in events]


@settings(max_examples=500, deadline=None)
@given(before=st.lists(_READS, max_size=4), read=_READS, after=_READS)
# One case per check the shortcut makes, where skipping it would go wrong.
@example(before=[b": s\n"], read=b"data: a\rb\n\n", after=b"")  # CR: two lines
@example(before=[b"data: x\n"], read=b"data: y\n\n", after=b"")  # data held
@example(before=[b"data: x"], read=b"data: y\n\n", after=b"")  # a partial line held
@example(before=[], read=b"data: a\n\n", after=b"\xef\xbb\xbfdata: b\n\n")  # BOM at start only
@example(before=[b": s\n"], read=b"data: a\nb", after=b"\n")  # no blank line after it
@example(before=[b"event: e\n"], read=b"data: a\n\n", after=b"data: b\n\n")  # type set
@example(before=[b"retry: 5\n"], read=b"data: a\n\n", after=b"data: b\n\n")  # retry set
@example(before=[b": s\n"], read=b'{"a":1}x\n\n', after=b"")  # not a data line
def test_one_payload_is_what_feed_makes_of_a_lone_event_or_leaves_the_decoder_alone(
    before, read, after
):
    # The relay's per-read shortcut: where it answers, the full decoder dispatches exactly that
    # one event from the read and holds nothing; where it does not, nothing changed. Either way
    # the next read decodes exactly as it would have.
    fast, full = SSEDecoder(), SSEDecoder()
    for earlier in before:
        assert _seen(fast.feed(earlier)) == _seen(full.feed(earlier))
    payload = fast.one_payload(read)
    events = full.feed(read)
    if payload is None:
        assert _seen(fast.feed(read)) == _seen(events)
    else:
        assert [ev.raw for ev in events] == [payload] and not full.pending
    assert _seen(fast.feed(after)) == _seen(full.feed(after))
    assert fast.pending == full.pending
