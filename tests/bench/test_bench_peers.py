"""``bench peers`` runs end to end on a tiny load: every peer it could start is measured, every
event the simulator sent reaches the load through it, the pool of two engines shares the load
and is set against one engine, and a peer it could not start is reported as missing with the
reason. Added latency is a percentile of what each chunk gained, never a difference of two
percentiles."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from streamsafe_bench import peers

pytestmark = pytest.mark.timeout(180)


def test_bench_peers_counts_add_up_and_missing_peers_are_reported(tmp_path):
    wanted = ["direct", "python-floor", "streamsafe", "streamsafe-pool", "litellm"]
    if shutil.which("nginx") or os.access("/usr/sbin/nginx", os.X_OK):
        wanted.insert(1, "nginx")
    report = peers.run(
        streams=3,
        chunks=10,
        itl_ms=2.0,
        rounds=2,
        burst=3,
        peers=tuple(wanted),
        litellm_python=str(tmp_path / "no-such-venv" / "python"),
    )
    json.dumps(report)
    assert report["missing"].keys() == {"litellm"}
    assert "make peers" in report["missing"]["litellm"]
    assert list(report["peers"]) == [p for p in wanted if p != "litellm"]
    for name, peer in report["peers"].items():
        assert len(peer["rounds"]) == 2
        for fig in peer["rounds"]:
            assert fig["errors"] == []
            assert fig["streams_ok"] == 3 and fig["burst_streams_ok"] == 3
            # the role chunk, one chunk per token, [DONE]: each one through every peer
            assert fig["events_sent_upstream"] == fig["events_received"] == 3 * 12
            assert fig["burst_events_sent_upstream"] == fig["burst_events_received"] == 3 * 3
            # every peer but the pool talks to the first engine alone; the pool to both
            first, second = fig["streams_per_engine"]
            assert first + second == 3
            assert (second > 0 and first > 0) if name == "streamsafe-pool" else second == 0
        summary = peer["summary"]
        assert summary["latency_ms_p50"] is not None and summary["burst_ttft_ms_p50"] is not None
        if name != "direct":
            assert summary["cpu_s_per_100k_chunks"] > 0
            assert "added_latency_ms_p99" in summary and "saturated" in summary
            assert summary["preempted_per_1k_chunks"] >= 0
        if name == "streamsafe":  # the gateway against the floor of a Python relay
            assert summary["cpu_vs_floor"] > 0
    assert report["engines"] == 2
    assert report["peers"]["streamsafe-pool"]["summary"]["cpu_vs_one_engine"] > 0
    assert report["peers"]["streamsafe-pool"]["command"].count("--upstream") == 2
    assert report["peers"]["streamsafe"]["command"].count("--upstream") == 1
    table = peers.markdown_table(report)
    assert "| litellm | missing:" in table
    assert "streamsafe-pool / streamsafe, gateway CPU per chunk in the same round: " in table
    assert all(f"| {name} " in table for name in report["peers"])


def test_bench_peers_cli_writes_json_table_and_plot(tmp_path):
    from streamsafe.cli import main

    out = tmp_path / "out"
    argv = ["bench", "peers", "--streams", "2", "--chunks", "5", "--rounds", "1", "--burst", "2"]
    argv += ["--peers", "direct,streamsafe", "--json", str(out / "peers.json")]
    argv += ["--plot", str(out / "peers.png"), "--markdown", str(out / "peers.md")]
    assert main(argv) == 0
    report = json.loads((out / "peers.json").read_text())
    assert report["bench"] == "peers" and set(report["peers"]) == {"direct", "streamsafe"}
    assert (out / "peers.png").stat().st_size > 0
    assert "| streamsafe " in (out / "peers.md").read_text()


def test_added_p99_is_a_percentile_of_what_each_chunk_gained_not_a_difference_of_p99s():
    # Through the peer every chunk took 1 ms more than direct's median, but direct had a slow
    # tail the peer's run did not: p99 through (3) - p99 direct (5) would read -2 ms, below the
    # p50's +1 ms.
    def fig(p50: float, p99: float) -> dict[str, float]:
        return {
            "latency_ms_p50": p50,
            "latency_ms_p99": p99,
            "burst_ttft_ms_p50": p50,
            "burst_ttft_ms_p99": p99,
            "cpu_s_per_100k_chunks": 1.0,
            "wall_s": 1.0,
        }

    summary = peers._summarise({"direct": [fig(1.0, 5.0)], "proxy": [fig(2.0, 3.0)]})["proxy"]
    assert summary["added_latency_ms_p50"] == 1.0
    assert summary["added_latency_ms_p99"] == 2.0
    assert summary["added_burst_ttft_ms_p50"] == 1.0
    assert summary["added_burst_ttft_ms_p99"] == 2.0


def test_pool_is_set_against_one_engine_in_the_same_round():
    def fig(cpu: float) -> dict[str, float]:
        return {"cpu_s_per_100k_chunks": cpu, "wall_s": 1.0}

    summary = peers._summarise(
        {
            "streamsafe": [fig(2.0), fig(4.0), fig(3.0)],
            "streamsafe-pool": [fig(2.2), fig(4.0), fig(3.6)],
        }
    )
    assert summary["streamsafe-pool"]["cpu_vs_one_engine"] == pytest.approx(1.1)
    assert summary["streamsafe-pool"]["spread"]["cpu_vs_one_engine"] == pytest.approx((1.0, 1.2))
    assert "cpu_vs_one_engine" not in summary["streamsafe"]
