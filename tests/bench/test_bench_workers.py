"""The workers benchmark runs end to end on a tiny load: every stream of every case complete,
every figure reported, the redis-server's share counted where one is shared."""

from __future__ import annotations

import json
import shutil

import pytest

from streamsafe_bench import workers

pytestmark = pytest.mark.timeout(120)


def test_bench_workers_reports_throughput_and_cpu_per_case() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    report = workers.run(((1, False), (2, False)), streams=4, chunks=10, itl_ms=1.0)
    one, two = report["cases"]
    assert (one["workers"], one["redis"], two["workers"], two["redis"]) == (1, None, 2, "own")
    for case in report["cases"]:
        assert case["streams_ok"] == 4 and case["chunks"] == 4 * 12
        assert case["chunks_per_s"] > 0 and case["gateway_cpu_us_per_chunk"] > 0
    assert one["redis_cpu_us_per_chunk"] == 0 < two["redis_cpu_us_per_chunk"]
    json.dumps(report)


def test_a_case_is_a_count_or_a_count_given_redis() -> None:
    assert workers.parse_case("2") == (2, False)
    assert workers.parse_case("1+redis") == (1, True)
    for wrong in ("0", "x", "1+memcached", "-1"):
        with pytest.raises(ValueError):
            workers.parse_case(wrong)
