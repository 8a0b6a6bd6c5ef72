"""``streamsafe bench client`` runs and reports both clients on the same chunks."""

from __future__ import annotations

import json

from streamsafe_bench.client import run


def test_bench_client_reports_both_clients_on_the_same_chunks():
    report = run(n_chunks=200, rounds=1)
    assert report["bench"] == "client" and len(report["cases"]) == 4
    for case in report["cases"]:
        assert case["chunks"] == 200
        assert case["ratio"] > 0 and case["openai_chunks_per_s"] > 0


def test_bench_all_runs_each_benchmark_with_its_outputs_named_after_it(tmp_path, monkeypatch):
    """``bench all --out DIR`` gives every benchmark ``--json DIR/bench-NAME.json`` (and its plot
    and table where it has them); here with only the client benchmark, shrunk."""
    import streamsafe_bench.cli as bench_cli
    import streamsafe_bench.client as bench
    from streamsafe.cli import main

    monkeypatch.setattr(bench_cli, "_BENCHES", (("client", "streamsafe_bench.client"),))
    monkeypatch.setattr(bench, "run", lambda n, r: run(100, 1))
    assert main(["bench", "all", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench-client.json").read_text())
    assert data["cases"][0]["chunks"] == 100
