"""``streamsafe bench relay`` drives both relays through their real entry points, in process."""

from __future__ import annotations

import pytest

from streamsafe_bench import relay
from streamsafe_bench.relay import run

pytestmark = pytest.mark.timeout(60)


def test_bench_relay_times_both_relays_with_every_chunk_delivered():
    report = run(streams=(1, 3), chunks=200, rounds=2)
    assert report["bench"] == "relay" and [c["streams"] for c in report["cases"]] == [1, 3]
    for case in report["cases"]:
        assert case["streamsafe_ns"] > 0 and case["floor_ns"] > 0 and case["ratio"] > 0


def test_bench_relay_fails_when_a_relay_drops_chunks(monkeypatch):
    # The delivery check is real: a client transport that loses writes fails the run.
    monkeypatch.setattr(relay._Transport, "write", lambda self, data: None)
    with pytest.raises(RuntimeError, match="writes for"):
        run(streams=(1,), chunks=50, rounds=1)
