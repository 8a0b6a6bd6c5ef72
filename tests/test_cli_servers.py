"""``streamsafe serve`` and ``streamsafe simulate`` as a user runs them: real processes on a port
the system picks, real clients, then a clean stop."""

from __future__ import annotations

import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx2
from openai import OpenAI

_URL = re.compile(r"(http://127\.0\.0\.1:\d+)")


@contextmanager
def running(*args: str, timeout: float = 30.0) -> Iterator[str]:
    """Run ``streamsafe ARGS --port 0``; yield the URL it announces; stop it with SIGINT."""
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
    deadline = time.monotonic() + timeout
    seen = []
    url = None
    try:
        while url is None:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                raise AssertionError(f"no URL announced in {timeout} s: {seen}")
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"exited early ({proc.poll()}): {seen}")
            seen.append(line)
            if "on http://" in line:
                url = _URL.findall(line)[0]
        # Ready once it answers; the socket is bound and listening before the announce.
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _chat(url: str) -> str:
    client = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20)
    parts = []
    for chunk in client.chat.completions.create(
        model="sim-llama-8b",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=5,
        stream=True,
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


def test_simulate_serves_an_openai_client_on_a_picked_port():
    with running("simulate", "--itl-ms", "1") as url:
        assert len(_chat(url).split()) == 5
        assert httpx2.get(url + "/health").status_code == 200


def test_serve_without_upstream_starts_the_simulator_behind_the_gateway():
    with running("serve", "--heartbeat", "0.5") as url:
        assert len(_chat(url).split()) == 5
        stats = httpx2.get(url + "/stats").json()
        assert stats["generations_completed"] == 1
        assert httpx2.get(url + "/health").status_code == 200


def test_serve_enforces_header_limits_and_the_admin_key_given_on_the_command_line():
    args = ("serve", "--max-header-kb", "8", "--max-header-line-kb", "2", "--admin-key", "adm")
    with running(*args) as url:
        big = httpx2.get(url + "/health", headers={"x-big": "a" * 3000})
        assert big.status_code == 431
        assert big.json()["error"]["code"] == 431
        assert httpx2.get(url + "/stats").status_code == 401
        admin = httpx2.get(url + "/stats", headers={"Authorization": "Bearer adm"})
        assert admin.status_code == 200
        assert len(_chat(url).split()) == 5


def test_a_port_already_in_use_is_one_clear_line_and_no_traceback():
    # Was a raw OSError traceback (after "engine simulator running" for serve).
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for command in ("simulate", "serve"):
            args = [command, "--host", "127.0.0.1", "--port", str(port)]
            r = subprocess.run(
                [sys.executable, "-m", "streamsafe.cli", *args],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert r.returncode == 1
            assert "Traceback" not in r.stdout + r.stderr
            said = r.stderr.strip().splitlines()[-1]
            assert said == f"streamsafe {command}: cannot listen on 127.0.0.1:{port}: " + (
                "address already in use"
            )
