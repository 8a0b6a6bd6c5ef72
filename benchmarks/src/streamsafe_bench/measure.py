"""One load through one path, and what it cost: the measurement ``bench peers`` and
``bench overhead`` repeat for every path and round.

The load runs in its own process (:func:`streamsafe_bench.load.run_load`); meanwhile the server
under test's process tree is sampled for memory every 50 ms, and its CPU time (and, where asked,
the upstream's) and the times it was preempted are read before and after.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from streamsafe_bench.load import StreamResult, run_load
from streamsafe_bench.processes import (
    cpu_seconds,
    preempted_since,
    preemptions,
    process_tree,
    rss_bytes,
)
from streamsafe_bench.tap import Tap, Taps, latencies

__all__ = ["Phase", "measure_phase"]


@dataclass
class Phase:
    """One load through one path."""

    streams: list[StreamResult]
    wall_s: float
    loadgen_cpu_s: float
    server_cpu_s: float  # the server under test's tree; 0 for direct
    upstream_cpu_s: float  # the processes in ``upstream_pids``, if any
    rss_base: int
    rss_peak: int
    events_sent_upstream: int  # by the tap, for these streams
    server_preemptions: int = 0  # involuntary context switches of the server's tree

    @property
    def events_received(self) -> int:
        return sum(len(s.arrivals) for s in self.streams)

    @property
    def streams_ok(self) -> int:
        return sum(1 for s in self.streams if s.complete and s.status == 200)

    @property
    def errors(self) -> list[str]:
        return sorted({s.error[:200] for s in self.streams if s.error})

    def latencies(self, tap: Tap | Taps) -> list[float]:
        """Tap-to-arrival seconds of every event of this load."""
        return latencies(tap.sent, {s.key: s.arrivals for s in self.streams})

    def rss_per_stream(self) -> float:
        """Resident memory the load added, in bytes per stream."""
        return (self.rss_peak - self.rss_base) / max(len(self.streams), 1)


def measure_phase(
    url: str,
    tap: Tap | Taps,
    streams: int,
    tokens: int,
    tag: str,
    *,
    server_pid: int | None = None,
    upstream_pids: Sequence[int] = (),
) -> Phase:
    """Run ``streams`` x ``tokens`` against ``url`` (keys ``<tag>-<i>``); charge CPU and memory
    to ``server_pid``'s process tree."""
    pids = process_tree(server_pid) if server_pid is not None else []
    base = rss_bytes(pids)
    peak = [base]

    def sample() -> None:
        peak[0] = max(peak[0], rss_bytes(pids))

    cpu0, up0, pre0 = cpu_seconds(pids), cpu_seconds(upstream_pids), preemptions(pids)
    load = run_load(url, streams, tokens, tag, sample=sample if pids else None)
    cpu, up = cpu_seconds(pids) - cpu0, cpu_seconds(upstream_pids) - up0
    pre = preempted_since(pre0, pids)
    sent = sum(len(tap.sent.get(s.key, ())) for s in load.streams)
    return Phase(load.streams, load.wall_s, load.cpu_s, cpu, up, base, peak[0], sent, pre)
