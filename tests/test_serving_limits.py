"""What one connection may cost the server (issue row 5): header sizes, unfinished requests and
the number of connections are bounded before the gateway sees anything, and every refusal is a
JSON error."""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Iterator

import httpx2
import orjson
import pytest

from server_stops import stop_later
from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerLimits, ServerThread
from streamsafe.server.unfinished import UnfinishedRequests, client_key
from waiting import wait_until

_BODY = orjson.dumps(
    {"model": "sim-llama-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
)


@contextlib.contextmanager
def _gateway(limits: ServerLimits, api_keys: tuple[str, ...] = ()) -> Iterator[ServerThread]:
    """A gateway serving with ``limits`` in front of a simulator; both stop in the background
    (see server_stops)."""
    sim = Simulator(SimConfig(itl_ms=0.5, itl_ms_per_seq=0.0, prefill_ms_per_token=0.0))
    sim_server = ServerThread(sim).start()
    try:
        config = GatewayConfig(upstream=sim_server.url, api_keys=api_keys)
        server = ServerThread(Gateway(config), limits=limits)
        server.start()
    except BaseException:
        sim_server.stop()
        raise
    try:
        yield server
    finally:
        stop_later(server, sim_server)


def _connect(server: ServerThread) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one response with a Content-Length (the socket's own timeout
    bounds the wait)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed before a response: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


def _json_error(headers: dict[str, str], body: bytes) -> dict[str, object]:
    assert headers["content-type"] == "application/json"
    error = orjson.loads(body)["error"]
    assert isinstance(error, dict) and error["message"]
    return error


def _answered(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def test_a_header_line_over_the_line_limit_is_431() -> None:
    with _gateway(ServerLimits(max_header_line_bytes=4096)) as server, _connect(server) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-big: "
            + b"a" * 5000
            + b"\r\ncontent-length: %d\r\n\r\n" % len(_BODY)
            + _BODY
        )
        status, headers, body = _read_response(sock)
        assert status == 431
        assert _json_error(headers, body)["code"] == 431


def test_a_long_request_line_is_414() -> None:
    with _gateway(ServerLimits(max_header_line_bytes=4096)) as server, _connect(server) as sock:
        sock.sendall(b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nhost: x\r\n\r\n")
        status, headers, body = _read_response(sock)
        assert status == 414
        _json_error(headers, body)


def test_too_many_header_lines_are_431() -> None:
    with _gateway(ServerLimits(max_headers=20)) as server, _connect(server) as sock:
        lines = b"".join(b"x-h%d: v\r\n" % i for i in range(30))
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n" + lines + b"\r\n")
        status, _, _ = _read_response(sock)
        assert status == 431


def test_megabytes_of_headers_are_refused_early_with_431() -> None:
    # 8 MB of header lines, each under the line limit: the server answers once it has seen its
    # total limit, long before the end, and reads no further.
    limits = ServerLimits(max_header_bytes=64 * 1024)
    with _gateway(limits) as server, _connect(server) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        line = b"x-pad: " + b"p" * 8000 + b"\r\n"
        sent = 0
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            while sent < 8 * 1024 * 1024 and not _answered(sock):
                sock.sendall(line)
                sent += len(line)
            if sent >= 8 * 1024 * 1024:
                sock.sendall(b"content-length: %d\r\n\r\n" % len(_BODY) + _BODY)
        status, headers, body = _read_response(sock)
        assert status == 431
        _json_error(headers, body)
        assert sent < 4 * 1024 * 1024


def test_unfinished_headers_get_408_after_the_header_timeout() -> None:
    with _gateway(ServerLimits(header_timeout=0.3)) as server, _connect(server) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: ")
        status, headers, body = _read_response(sock)
        assert status == 408
        _json_error(headers, body)


def test_an_unfinished_body_gets_408_after_the_body_timeout() -> None:
    with _gateway(ServerLimits(body_timeout=0.3)) as server, _connect(server) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % len(_BODY)
            + _BODY[:10]
        )
        status, headers, body = _read_response(sock)
        assert status == 408
        _json_error(headers, body)


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout() -> None:
    with _gateway(ServerLimits(header_timeout=0.3)) as server, _connect(server) as sock:
        assert sock.recv(100) == b""  # closed by the server; the socket timeout bounds it


def test_connections_past_the_cap_get_503_and_a_freed_place_is_reused() -> None:
    with _gateway(ServerLimits(max_connections=2)) as server:
        held = [_connect(server), _connect(server)]
        try:
            for sock in held:  # each answered: both are open connections of the server
                sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
                assert _read_response(sock)[0] == 200
            with _connect(server) as third:
                status, headers, body = _read_response(third)
                assert status == 503
                assert headers["retry-after"] == "1"
                _json_error(headers, body)
            held.pop().close()
            # The server notices the close on its loop; then a place is free.
            wait_until(
                lambda: httpx2.get(server.url + "/health", timeout=5).status_code == 200,
                10,
                "a place freed by the close",
            )
        finally:
            for sock in held:
                sock.close()


def test_ordinary_requests_pass_untouched_including_a_body_sent_in_pieces() -> None:
    with _gateway(ServerLimits(body_timeout=5.0)) as server, _connect(server) as sock:
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(_BODY)
        )
        sock.sendall(head + _BODY[:5])
        sock.sendall(_BODY[5:])
        status, _, body = _read_response(sock)
        assert status == 200
        assert orjson.loads(body)["choices"][0]["message"]["content"]
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")  # same kept-alive connection
        assert _read_response(sock)[0] == 200


def test_clients_without_a_key_trickling_bodies_cannot_hold_every_connection() -> None:
    # 30 connections without a key each send a chunked completion request and then its body a
    # byte at a time, on a server that holds 30 connections. Each is answered 401 before its
    # body; the server used to read on to the next request for as long as the bytes came, so
    # a client with a key got 503 for as long as the attack lasted. Now each answered
    # connection closes after its lingering bound, and the keyed client is served.
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    with _gateway(ServerLimits(max_connections=30), api_keys=("good-key",)) as server:
        attackers = [_connect(server) for _ in range(30)]
        try:
            for sock in attackers:
                sock.sendall(head + b"1\r\n{\r\n")
            start = time.monotonic()
            served_after = None
            while time.monotonic() - start < 25 and served_after is None:
                for sock in list(attackers):  # a byte each, for as long as they are open
                    try:
                        sock.sendall(b"1\r\n \r\n")
                    except OSError:
                        attackers.remove(sock)
                with contextlib.suppress(httpx2.HTTPError):
                    r = httpx2.post(
                        server.url + "/v1/chat/completions",
                        content=_BODY,
                        headers={"authorization": "Bearer good-key"},
                        timeout=2,
                    )
                    if r.status_code == 200:
                        served_after = time.monotonic() - start
                time.sleep(0.2)  # the attackers' pace: the behaviour under test
            assert served_after is not None and served_after < 20
        finally:
            for sock in attackers:
                sock.close()


def _connect_from(server: ServerThread, source: str) -> socket.socket:
    """A connection from ``source``, another loopback address than the test's own."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect((server.host, server.port))
    return sock


def test_a_body_below_the_minimum_rate_gets_408_and_one_above_it_is_served() -> None:
    # Two bodies, each sent over three times the body timeout without a pause as long as it:
    # one at 20 bytes a second, one at 4000. The slow one was read for as long as its bytes came
    # (a connection held at will); now its deadline, moved on a second per 100 bytes, passes.
    limits = ServerLimits(body_timeout=0.5, min_body_rate=100)
    padded = _BODY + b" " * 6000  # JSON may end in whitespace
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(padded)
    )
    with _gateway(limits) as server, _connect(server) as slow, _connect(server) as quick:
        slow.sendall(head)
        quick.sendall(head)
        sent = 0
        start = time.monotonic()
        while sent < len(padded) and time.monotonic() - start < 10:
            time.sleep(0.05)  # the pace of both bodies
            quick.sendall(padded[sent : sent + 200])
            sent += 200
            if not _answered(slow):
                slow.sendall(b" ")
        status, _, body = _read_response(quick)
        assert status == 200 and orjson.loads(body)["choices"]
        status, headers, body = _read_response(slow)
        assert status == 408
        assert "slower than 100 bytes a second" in _json_error(headers, body)["message"]


def test_an_address_owing_its_share_of_requests_is_refused_more_and_others_are_not() -> None:
    # Ten connections of 127.0.0.2 with requests begun and unfinished hold its share of a cap of
    # 40 (a quarter). Another one beginning a request, a kept-alive one beginning its next, or
    # one that sends nothing for FIRST_BYTE_S is refused with 503; a client of another address
    # is served; once one of the ten sends its request whole, the address may begin another.
    # Before, each was held or served: one address could take every place.
    limits = ServerLimits(max_connections=40, keep_alive_timeout=60)
    get = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
    begun = b"GET /health HTTP/1.1\r\n"
    with _gateway(limits) as server:
        # A burst of connections, each sending a whole request at once: never counted as owed.
        burst = [_connect_from(server, "127.0.0.2") for _ in range(20)]
        for sock in burst:
            sock.sendall(get)
        assert [_read_response(sock)[0] for sock in burst] == [200] * 20
        kept, *others = burst  # kept alive, owing nothing
        for sock in others:
            sock.close()
        owing = [_connect_from(server, "127.0.0.2") for _ in range(10)]
        try:
            for sock in owing:
                sock.sendall(begun)
            for late in (_connect_from(server, "127.0.0.2"), kept):
                late.sendall(begun)
                status, headers, body = _read_response(late)
                assert (status, headers["retry-after"], headers["connection"]) == (
                    503,
                    "1",
                    "close",
                )
                message = _json_error(headers, body)["message"]
                assert "10 connections with requests still arriving" in message
                late.close()
            with _connect_from(server, "127.0.0.2") as silent:
                assert _read_response(silent)[0] == 503  # after FIRST_BYTE_S
            assert httpx2.get(server.url + "/health", timeout=5).status_code == 200
            owing[0].sendall(b"host: x\r\n\r\n")
            assert _read_response(owing[0])[0] == 200
            with _connect_from(server, "127.0.0.2") as another:
                another.sendall(get)
                assert _read_response(another)[0] == 200
        finally:
            for sock in owing:
                sock.close()
        # Every connection let go of its place, refused ones included: none is owed forever.
        unfinished = server._server.config.http.unfinished  # the server's protocol class's
        wait_until(lambda: not unfinished.by_address, timeout=10, what="no request owed")


def test_the_count_per_address_is_bounded_and_keeps_only_addresses_that_owe() -> None:
    count = UnfinishedRequests(bound=2)
    assert count.begin("a") and count.begin("a") and not count.begin("a")
    assert count.begin("b")
    count.end("a")
    assert count.begin("a")
    for address in ("a", "a", "b"):
        count.end(address)
    assert count.by_address == {}


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("127.0.0.2", "127.0.0.2"),
        ("::ffff:10.1.2.3", "10.1.2.3"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),  # the same host's network
        ("fe80::1%eth0", "fe80::/64"),
    ],
)
def test_an_ipv6_client_is_counted_by_its_64_network(host: str, key: str) -> None:
    assert client_key(host) == key


def test_the_share_of_the_cap_per_address() -> None:
    assert ServerLimits(max_connections=30).max_unfinished_per_client == 7
    assert ServerLimits(max_connections=2).max_unfinished_per_client == 1
    assert ServerLimits(max_connections=30, unfinished_share=1).max_unfinished_per_client is None
    assert ServerLimits(max_connections=None).max_unfinished_per_client is None


@pytest.mark.parametrize(
    "bad",
    [
        {"max_header_bytes": 0},
        {"header_timeout": 0},
        {"body_timeout": -1},
        {"max_connections": 0},
        {"min_body_rate": -1},
        {"unfinished_share": 0},
        {"unfinished_share": 1.5},
    ],
)
def test_limits_are_validated(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ServerLimits(**bad)  # type: ignore[arg-type]


def test_a_burst_of_pipelined_requests_is_not_taken_for_one_large_header() -> None:
    requests = 200
    with _gateway(ServerLimits(max_header_bytes=4096)) as server, _connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n" * requests)  # ~7 KiB at once
        answered = 0
        data = b""
        while answered < requests:
            chunk = sock.recv(65536)
            assert chunk, f"closed after {answered} answers"
            data += chunk
            answered = data.count(b"HTTP/1.1 200 ")
            assert b"HTTP/1.1 431" not in data


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_every_accepted_connection_has_nagle_off(loop: str) -> None:
    # A response goes out in several writes (head, body messages); with Nagle on, each write
    # after the first waited for an ACK that a kept-alive client delays by 40 ms.
    async def app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
            await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]

    async def nodelay(server: ServerThread) -> list[int]:
        connections = server._server.server_state.connections  # uvicorn's open connections
        return [
            c.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            for c in connections
        ]

    with ServerThread(app, loop=loop) as server:
        sock = _connect(server)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)  # the client's side is not it
        sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        flags = server.call(nodelay(server))
        sock.close()
    assert flags and all(flags), flags


def test_a_serving_process_freezes_what_startup_made():
    import subprocess
    import sys

    code = (
        "import gc; from streamsafe.server import run; "
        "before = gc.get_threshold(); run.tune_collector(); "
        "print(gc.get_freeze_count(), len(gc.get_objects()), before == gc.get_threshold())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    frozen, scanned, threshold_unchanged = out.stdout.split()
    assert int(frozen) > 1000  # the modules and objects imported at startup
    assert int(scanned) < 100  # what collections still walk: made since
    assert threshold_unchanged == "True"
