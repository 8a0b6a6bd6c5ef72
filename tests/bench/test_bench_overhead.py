"""The overhead benchmark runs end to end on a tiny load and reports every figure."""

from __future__ import annotations

import json

from streamsafe_bench import overhead


def test_bench_overhead_reports_latency_cpu_and_memory() -> None:
    report = overhead.run(streams=4, chunks=10, itl_ms=1.0)
    assert report["direct"]["chunks"] == report["gateway"]["chunks"] == 4 * 12
    for key in (
        "added_latency_ms_p50",
        "added_latency_ms_p99",
        "gateway_cpu_s_per_100k_chunks",
        "gateway_memory_per_live_stream_bytes",
    ):
        assert key in report
    assert report["gateway"]["generations_started"] == 4 + 4  # the load plus the warmup
    json.dumps(report)
