"""The demo, quick mode, end to end: every scenario must keep showing what it claims. A
scenario that stops showing its claim fails the build."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streamsafe.cli import main


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("demo")
    rc = main(
        [
            "demo",
            "--quick",
            "--json",
            str(out / "demo.json"),
            "--plot",
            str(out / "demo.png"),
        ]
    )
    assert rc == 0
    report = json.loads((out / "demo.json").read_text())
    report["_png"] = out / "demo.png"
    return report


@pytest.fixture(scope="module")
def rows(demo: dict[str, Any]) -> list[dict[str, Any]]:
    return demo["scenarios"]


_KEYS = {
    "name",
    "client",
    "path",
    "logical_requests",
    "client_attempts",
    "upstream_generations",
    "amplification",
    "engine_crashes",
    "completed",
    "failed",
    "tokens_lost",
    "tokens_repeated",
    "p50_s",
    "p99_s",
    "memory_peak_tokens",
    "memory_capacity_tokens",
}


@pytest.mark.timeout(240)
def test_report_has_every_scenario_with_every_key(demo: dict[str, Any], rows):
    assert [r["name"][0] for r in rows] == list("123456")
    for row in rows:
        assert row.keys() >= _KEYS
        assert row["client"] in ("llama-stack-client", "openai", "streamsafe")
        assert row["path"] in ("direct", "gateway")
        assert row["amplification"] == round(
            row["upstream_generations"] / row["logical_requests"], 3
        )
    png = Path(demo["_png"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("index", [0, 1])
def test_stainless_clients_straight_to_the_engine_pile_up_copies_and_kill_it(rows, index):
    row = rows[index]
    assert row["path"] == "direct"
    assert row["engine_crashes"] >= 1
    assert row["amplification"] > 1.0
    assert row["client_attempts"] > row["logical_requests"]
    assert row["completed"] < row["logical_requests"]


@pytest.mark.parametrize("index", [2, 3, 4, 5])
def test_streamsafe_paths_never_crash_and_send_each_request_once(rows, index):
    row = rows[index]
    assert row["engine_crashes"] == 0
    assert row["amplification"] == 1.0
    assert row["memory_peak_tokens"] <= row["memory_capacity_tokens"]
    assert row["completed"] == row["logical_requests"]
    assert row["tokens_lost"] == 0
    assert row["tokens_repeated"] == 0


def test_streamsafe_client_direct_sends_no_copy(rows):
    assert rows[2]["client_attempts"] == rows[2]["logical_requests"]


def test_llama_stack_client_retries_reach_the_gateway_and_attach(rows):
    first_token = rows[3]
    assert first_token["client_attempts"] > first_token["logical_requests"]  # retries arrived
    assert first_token["upstream_generations"] == first_token["logical_requests"]


def test_gateway_heartbeats_leave_nothing_to_retry(rows):
    assert rows[4]["client_attempts"] == rows[4]["logical_requests"]


def test_engine_cuts_are_continued_and_no_token_is_lost_or_repeated(rows):
    row = rows[5]
    assert row["engine_cuts"] > 0
    assert row["upstream_continuations"] > 0
    assert row["tokens_lost"] == 0 and row["tokens_repeated"] == 0
    assert row["completed"] == row["logical_requests"]


@pytest.fixture(scope="module")
def tier_rows(demo: dict[str, Any]) -> list[dict[str, Any]]:
    return demo["llama_stack"]


def test_the_real_middle_tier_rows_are_there(tier_rows):
    assert [r["name"].split(".")[0] for r in tier_rows] == ["7", "8", "9", "10"]
    assert [r["position"] for r in tier_rows] == ["direct", "direct", "in-front", "in-front"]


def test_without_streamsafe_llama_stack_sends_the_engine_copies(tier_rows):
    storm = tier_rows[0]
    assert storm["engine_requests"] > storm["calls"]  # the client's retries became copies
    assert storm["exact"] < storm["calls"]


@pytest.mark.parametrize("index", [2, 3])
def test_streamsafe_in_front_of_llama_stack_answers_every_call_once(tier_rows, index):
    row = tier_rows[index]
    assert row["exact"] == row["calls"] and not row["errors"]
    assert row["engine_generations"] == row["calls"]
    assert row["engine_crashes"] == 0
