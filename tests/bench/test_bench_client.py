"""``streamsafe bench client`` runs and reports both clients on the same chunks."""

from __future__ import annotations

import json

from streamsafe.bench.client import run, run_default


def test_bench_client_reports_both_clients_on_the_same_chunks():
    report = run(n_chunks=200, rounds=1)
    assert report["bench"] == "client" and len(report["cases"]) == 4
    for case in report["cases"]:
        assert case["chunks"] == 200
        assert case["ratio"] > 0 and case["openai_chunks_per_s"] > 0


def test_bench_client_default_writes_json(tmp_path, monkeypatch):
    import streamsafe.bench.client as bench

    monkeypatch.setattr(bench, "run", lambda n, r: run(100, 1))
    assert run_default(str(tmp_path)) == 0
    data = json.loads((tmp_path / "bench-client.json").read_text())
    assert data["cases"][0]["chunks"] == 100
