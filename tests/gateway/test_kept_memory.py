"""What finished generations kept for replay cost: everything they hold is counted against
``--max-kept-mb``, request bodies are not kept, and ``--max-kept`` caps their number. Measured
as the RSS of a real ``streamsafe serve`` process."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx2
import psutil
import pytest
from gateway_helpers import chat_body, make_stack, post_stream

_URL = re.compile(r"(http://127\.0\.0\.1:\d+)")
MiB = 1024 * 1024


@contextmanager
def _process(*args: str) -> Iterator[tuple[str, psutil.Process]]:
    """``streamsafe ARGS`` on a port it picks: its URL and process; stopped with SIGINT."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamsafe.cli", *args, "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 30
    try:
        url = None
        while url is None:
            assert sel.select(max(0.0, deadline - time.monotonic())), "no URL announced"
            line = proc.stdout.readline()
            assert line, f"exited early ({proc.poll()})"
            if "on http://" in line:
                url = _URL.findall(line)[0]
        # Keep reading its log, so a full pipe never blocks it; the reader ends with it.
        reader = threading.Thread(target=proc.stdout.read, daemon=True)
        reader.start()
        yield url, psutil.Process(proc.pid)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextmanager
def _gateway(*gateway_args: str) -> Iterator[tuple[str, psutil.Process]]:
    sim_args = ("--itl-ms", "0", "--itl-ms-per-seq", "0", "--prefill-ms-per-token", "0")
    with (
        _process("simulate", *sim_args, "--memory-tokens", "100000000") as (sim_url, _),
        _process("serve", "--upstream", sim_url, "--max-body-kb", "1024", *gateway_args) as gw,
    ):
        yield gw


def _send(url: str, requests: range, pad_bytes: int) -> None:
    """Requests ``i`` of ``requests``, every other one with an Idempotency-Key, 4 at once."""

    def some(part: range) -> None:
        pad = "x" * pad_bytes
        with httpx2.Client(timeout=30) as client:
            for i in part:
                body = chat_body(f"request {i} {pad}", max_tokens=2, stream=i % 4 < 2)
                headers = {"Idempotency-Key": f"key-{i}"} if i % 2 else {}
                r = client.post(url + "/v1/chat/completions", json=body, headers=headers)
                assert r.status_code == 200, r.text

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(some, [requests[j::4] for j in range(4)]))


def _growth(url: str, proc: psutil.Process, count: int, pad_bytes: int) -> tuple[int, dict]:
    _send(url, range(200), pad_bytes)  # warm up: code paths, pools, first allocations
    before = proc.memory_info().rss
    _send(url, range(200, 200 + count), pad_bytes)
    stats = httpx2.get(url + "/stats").json()
    return proc.memory_info().rss - before, stats


@pytest.mark.timeout(300)
def test_large_request_bodies_are_not_kept_with_finished_generations() -> None:
    # 400 bodies of 256 KiB: 100 MiB if kept; the cap is 8 MiB.
    with _gateway("--max-kept-mb", "8") as (url, proc):
        growth, stats = _growth(url, proc, 400, 256 * 1024)
    assert stats["kept_generations"] == 600  # all kept: what they hold is small
    assert stats["kept_bytes"] <= 8 * MiB
    assert growth <= 1.5 * 8 * MiB, f"RSS grew {growth / MiB:.1f} MiB"


@pytest.mark.timeout(300)  # seconds on a quiet machine, minutes on a loaded one
def test_many_tiny_generations_are_counted_for_what_they_hold() -> None:
    # 2,500 tiny generations: each holds a few KiB however short its answer (8 MiB in all,
    # nearly three times the RSS bound), so the 2 MiB cap must evict; counting only their
    # events would keep them all.
    with _gateway("--max-kept-mb", "2") as (url, proc):
        growth, stats = _growth(url, proc, 2500, 0)
    assert stats["evicted"] > 0
    assert stats["kept_bytes"] <= 2 * MiB
    assert growth <= 1.5 * 2 * MiB, f"RSS grew {growth / MiB:.1f} MiB"


def test_the_number_of_kept_generations_is_capped() -> None:
    with make_stack(max_kept_generations=5) as s:
        for i in range(12):
            assert post_stream(s.url, chat_body(f"n{i}", max_tokens=2)).status_code == 200
        stats = s.gw.stats()
        assert stats["kept_generations"] == 5 and stats["evicted"] == 7


def test_an_abandoned_generation_is_freed_by_its_last_reference() -> None:
    # A stream whose client left is aborted: its task ends cancelled, and the cancellation's
    # traceback holds the frames that hold the generation, its log and its upstream connection.
    # Nothing may refer back to that exception (the task, through the attempt's watch; the
    # connection, through the relay's sink), or all of it waits for the garbage collector,
    # often long enough to be promoted and kept until a full collection.
    import gc

    from gateway_helpers import fast_sim, wait_for

    from streamsafe.gateway.generations.generation import Generation

    def alive(gen_id: str) -> bool:  # freed, or only unreachable (the collector is off)?
        return any(isinstance(o, Generation) and o.id == gen_id for o in gc.get_objects())

    with make_stack(fast_sim(itl_ms=20), grace=0.0) as s:
        gc.collect()
        gc.disable()
        try:
            with (
                httpx2.Client(timeout=30) as client,
                client.stream(
                    "POST", s.url + "/v1/chat/completions", json=chat_body(max_tokens=500)
                ) as r,
            ):
                gen_id = r.headers["x-streamsafe-generation"]
                assert alive(gen_id)
                next(r.iter_lines())  # it flows; then the client leaves
            wait_for(lambda: s.sim.stats()["generations_aborted"] == 1, what="the engine aborts")
            wait_for(lambda: gen_id not in s.gw.registry.generations, what="the gateway forgets it")
            wait_for(lambda: not alive(gen_id), timeout=5, what="the generation freed by refcount")
        finally:
            gc.enable()
