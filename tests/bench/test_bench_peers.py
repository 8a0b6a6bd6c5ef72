"""``bench peers`` runs end to end on a tiny load: every peer it could start is measured, every
event the simulator sent reaches the load through it, and a peer it could not start is reported
as missing with the reason."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from streamsafe.bench import peers

pytestmark = pytest.mark.timeout(180)


def test_bench_peers_counts_add_up_and_missing_peers_are_reported(tmp_path):
    wanted = ["direct", "python-floor", "streamsafe", "litellm"]
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
        summary = peer["summary"]
        assert summary["latency_ms_p50"] is not None and summary["burst_ttft_ms_p50"] is not None
        if name != "direct":
            assert summary["cpu_s_per_100k_chunks"] > 0
            assert "added_latency_ms_p99" in summary and "saturated" in summary
            assert summary["preempted_per_1k_chunks"] >= 0
        if name == "streamsafe":  # the gateway against the floor of a Python relay
            assert summary["cpu_vs_floor"] > 0
    table = peers.markdown_table(report)
    assert "| litellm | missing:" in table
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
