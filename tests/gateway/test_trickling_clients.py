"""Clients that trickle their requests cannot take every connection of a real ``streamsafe
serve`` process (issue 33, row 5): thirty request bodies sent a byte at a time, without API keys,
held a gateway capped at thirty connections, and every other client got 503 for as long as the
bytes came. Now the connections of one address with a request still arriving are bounded
(``--unfinished-share``), and a body must keep up ``--min-body-rate`` once its first
``--body-timeout`` is past: a well-behaved client elsewhere is served."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx2
import orjson
from gateway_helpers import chat_body

from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe.server import serve_in_thread
from streamsafe_bench.processes import ServerProcess
from waiting import wait_until

_HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
    b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
)
_CAP = 30


@contextlib.contextmanager
def _gateway(*flags: str) -> Iterator[str]:
    """A ``streamsafe serve`` process with no API keys, capped at thirty connections, in front
    of a simulator; its URL."""
    sim = Simulator(SimConfig(itl_ms=0.5, itl_ms_per_seq=0.0, prefill_ms_per_token=0.0))
    with serve_in_thread(sim) as engine:
        gateway = ServerProcess(
            "serve", "--upstream", engine.url, "--max-connections", str(_CAP), *flags
        )
        try:
            yield gateway.url
        finally:
            gateway.stop()


def _trickle(url: str, sources: list[str]) -> tuple[list[socket.socket], threading.Event]:
    """One connection from each of ``sources``, each sending a chunked body's head and then a
    byte of it every 0.2 s (from a thread, until the event is set) until it is answered."""
    port = urlsplit(url).port
    attackers = []
    for source in sources:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        attackers.append(sock)
    for sock in attackers:
        with contextlib.suppress(OSError):
            sock.sendall(_HEAD + b"1\r\n{\r\n")
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.2):
            for sock in attackers:
                if not _answered(sock):  # an answered one is left alone for its answer
                    with contextlib.suppress(OSError):
                        sock.sendall(b"1\r\n \r\n")

    threading.Thread(target=trickle, daemon=True).start()
    return attackers, stop


def _answered(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def _status_and_error(sock: socket.socket) -> tuple[int, dict[str, str], str]:
    data = b""
    while b"}}" not in data:  # the JSON error's end (the socket's timeout bounds it)
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, orjson.loads(body)["error"]["message"]


def _served(url: str) -> bool:
    """Whether a client of this machine's own address (127.0.0.1) gets its answer now."""
    with contextlib.suppress(httpx2.HTTPError):
        r = httpx2.post(url + "/v1/chat/completions", json=chat_body(stream=False), timeout=5)
        return r.status_code == 200 and bool(r.json()["choices"])
    return False


def test_thirty_bodies_trickled_from_one_address_leave_room_for_everyone_else() -> None:
    with _gateway() as url:
        attackers, stop = _trickle(url, ["127.0.0.2"] * _CAP)
        try:
            wait_until(lambda: _served(url), timeout=20, what="a client elsewhere served")
            answered = [sock for sock in attackers if _answered(sock)]
            # A quarter of the cap (7) is still held by the attacking address, its bodies
            # read as they come; the rest were refused at once, with a reason to retry later.
            assert len(attackers) - len(answered) == _CAP // 4
            for sock in answered:
                status, headers, message = _status_and_error(sock)
                assert (status, headers["retry-after"]) == (503, "1")
                assert "requests still arriving" in message
        finally:
            stop.set()
            for sock in attackers:
                sock.close()


def test_thirty_bodies_trickled_from_thirty_addresses_are_cut_at_their_minimum_rate() -> None:
    # One connection per address: the share of the cap does not bind them. Each body comes at
    # about 5 bytes a second, never pausing as long as --body-timeout: only the minimum rate
    # ends them (408) once the default --body-timeout (10 s) is past, and the places they held
    # are free again: with the defaults, a client elsewhere is served within 20 s.
    sources = [f"127.0.0.{i}" for i in range(2, 2 + _CAP)]
    with _gateway() as url:
        attackers, stop = _trickle(url, sources)
        try:
            wait_until(lambda: _served(url), timeout=20, what="a client elsewhere served")
            wait_until(lambda: all(_answered(sock) for sock in attackers), what="all cut")
            for sock in attackers:
                status, _, message = _status_and_error(sock)
                assert status == 408 and "slower than 1024 bytes a second" in message
        finally:
            stop.set()
            for sock in attackers:
                sock.close()
