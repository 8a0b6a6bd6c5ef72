"""The compact in-process event log reads back exactly what was appended, from any offset, and
holds a chat stream in about its content bytes."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsafe.gateway.generations.event_log import MemoryEventLog
from streamsafe_bench.recorded import recorded_chat_events

pytestmark = pytest.mark.unit

# Payloads alike and unlike their neighbours: shared prefixes and suffixes of every length,
# empty ones, and batches of any size.
_payload = st.one_of(
    st.binary(max_size=40),
    st.builds(lambda w: b'{"delta":{"content":"' + w + b'"},"x":null}', st.binary(max_size=8)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_payload, min_size=1, max_size=20), max_size=30), st.data())
def test_every_offset_reads_back_exactly_what_was_appended(batches, data):
    log = MemoryEventLog()
    appended: list[bytes] = []
    for batch in batches:
        assert log.append_nowait(batch) == len(appended) + len(batch)
        appended.extend(batch)
        start = data.draw(st.integers(0, len(appended) + 1))
        assert log.read_nowait(start) == appended[start:]
    for start in range(len(appended) + 2):
        assert log.read_nowait(start) == appended[start:]
    assert asyncio.run(log.read(0)) == appended and log.length == len(appended)


def test_a_chat_stream_costs_about_its_content_not_its_payloads():
    events = [e[len(b"data: ") : -2] for e in recorded_chat_events(500)]
    log = MemoryEventLog()
    for event in events:
        log.append_nowait([event])
    payload_bytes = sum(map(len, events))
    assert log.read_nowait(0) == events
    assert log.nbytes < payload_bytes / 4, (log.nbytes, payload_bytes)
