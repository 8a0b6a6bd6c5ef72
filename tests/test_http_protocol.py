"""The HTTP/1.1 server every app here runs on (streamsafe.server.protocol, streamsafe.server.cycle):
what a client sees of framing, keep-alive, pipelining, HEAD, HTTP/1.0, 100-continue and failing
apps, on both event loops, over real sockets; and, in process, how many writes a response
costs."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import httptools
import orjson
import pytest

from server_stops import stop_later
from streamsafe.server import ServerLimits, ServerThread
from streamsafe.server.limits import LINGER_BYTES
from streamsafe.server.protocol import HttpProtocol
from waiting import wait_until

pytestmark = pytest.mark.timeout(60)

LOOPS = ["asyncio", "uvloop"]


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Routes by path: each shows one way an app answers (or fails to)."""
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/echo":  # the body back, with a length
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        head = [(b"content-length", b"%d" % len(body)), (b"x-method", scope["method"].encode())]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": body})
    elif path == "/stream":  # three pieces, no length: chunked (or until the close on 1.0)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for piece in (b"one,", b"two,", b"three"):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    elif path == "/slow":  # answers after the requests pipelined behind it arrived
        await asyncio.sleep(0.05)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"slow"})
    elif path == "/headers":  # the header names the app was given, after the whole body
        while (await receive()).get("more_body"):
            pass
        body = orjson.dumps(sorted(name.decode() for name, _ in scope["headers"]))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})
    elif path == "/raise":
        raise ValueError("a bug in the app")
    elif path == "/where":  # the Host, path and query the app was given
        host = [value.decode() for name, value in scope["headers"] if name == b"host"]
        query = scope["query_string"].decode()
        body = orjson.dumps({"host": host, "path": path, "query": query})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})
    elif path == "/nothing":
        return
    elif path == "/raise-after-start":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise ValueError("a bug half way")
    elif path == "/bad-header":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x", b"a\r\nb")]})
    elif path == "/too-long":
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"abc"})
    elif path == "/disconnect":  # tells, on the next request, whether it saw the client leave
        assert (await receive())["type"] == "http.request"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"open", "more_body": True})
        message = await receive()
        _seen.append(message["type"])
    elif path == "/flood":  # writes until told the client is gone, then says so on /
        gone = asyncio.Event()
        scope["extensions"]["streamsafe.on_disconnect"](gone.set)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        piece = {"type": "http.response.body", "body": b"x" * 65536, "more_body": True}
        while not gone.is_set():
            await send(piece)
        _seen.append("flood stopped")
    elif path == "/notice":  # never calls receive(): told of the client leaving by the server
        left = asyncio.Event()
        notice = scope["extensions"]["streamsafe.on_disconnect"]
        notice(lambda: (_seen.append("notice"), left.set()))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"open", "more_body": True})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(left.wait(), 20)
    else:
        body = orjson.dumps({"seen": _seen})
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": body})


_seen: list[str] = []


@contextlib.contextmanager
def _server(loop: str, limits: ServerLimits | None = None) -> Iterator[ServerThread]:
    server = ServerThread(_app, loop=loop, limits=limits).start()
    try:
        yield server
    finally:
        stop_later(server)


def _connect(server: ServerThread) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=10)


class _Reader:
    """Reads HTTP/1.1 responses off a socket, one at a time, framing as the server chose."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _more(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buf += chunk
        return bool(chunk)

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            assert self._more(), f"closed in the middle of a line: {self.buf!r}"
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def response(self, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
        status = int(self._line().split()[1])
        headers: dict[str, str] = {}
        while line := self._line():
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if head_only:
            return status, headers, b""
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while size := int(self._line(), 16):
                while len(self.buf) < size + 2:
                    assert self._more(), "closed inside a chunk"
                body += self.buf[:size]
                self.buf = self.buf[size + 2 :]
            assert self._line() == b""
            return status, headers, body
        if "content-length" in headers:
            length = int(headers["content-length"])
            while len(self.buf) < length:
                assert self._more(), "closed before the content-length"
            body, self.buf = self.buf[:length], self.buf[length:]
            return status, headers, body
        while self._more():  # until the close
            pass
        body, self.buf = self.buf, b""
        return status, headers, body

    def closed(self) -> bool:
        return not self.buf and not self._more()


@pytest.mark.parametrize("loop", LOOPS)
def test_responses_are_framed_and_the_connection_kept_alive(loop: str) -> None:
    with _server(loop) as server, _connect(server) as sock:
        reader = _Reader(sock)
        sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello")
        status, headers, body = reader.response()
        assert (status, body, headers["content-length"]) == (200, b"hello", "5")
        assert "date" in headers and "connection" not in headers
        sock.sendall(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")  # the same connection
        status, headers, body = reader.response()
        assert (status, headers["transfer-encoding"], body) == (200, "chunked", b"one,two,three")


@pytest.mark.parametrize("loop", LOOPS)
def test_a_chunked_request_body_sent_in_pieces_arrives_whole(loop: str) -> None:
    with _server(loop) as server, _connect(server) as sock:
        reader = _Reader(sock)
        sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        sock.sendall(b"3\r\nabc\r\n")
        sock.sendall(b"4\r\ndefg\r\n0\r\n\r\n")
        assert reader.response()[2] == b"abcdefg"


@pytest.mark.parametrize("loop", LOOPS)
def test_pipelined_requests_are_answered_in_order(loop: str) -> None:
    with _server(loop) as server, _connect(server) as sock:
        reader = _Reader(sock)
        sock.sendall(
            b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n"
            b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc"
            b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n"
        )
        assert [reader.response()[2] for _ in range(3)] == [b"slow", b"abc", b"one,two,three"]


@pytest.mark.parametrize("loop", LOOPS)
def test_head_keeps_the_length_and_sends_no_body(loop: str) -> None:
    with _server(loop) as server, _connect(server) as sock:
        reader = _Reader(sock)
        sock.sendall(b"HEAD /echo HTTP/1.1\r\nhost: x\r\n\r\n")
        status, headers, _ = reader.response(head_only=True)
        assert (status, headers["x-method"], headers["content-length"]) == (200, "HEAD", "0")
        sock.sendall(b"HEAD /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        status, headers, _ = reader.response(head_only=True)
        assert status == 200 and "transfer-encoding" not in headers
        sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nok")
        assert reader.response()[2] == b"ok"  # no stray body bytes came before it


@pytest.mark.parametrize("loop", LOOPS)
def test_http_1_0_gets_a_body_ended_by_the_close(loop: str) -> None:
    with _server(loop) as server, _connect(server) as sock:
        reader = _Reader(sock)
        sock.sendall(b"GET /stream HTTP/1.0\r\n\r\n")
        status, headers, body = reader.response()
        assert (status, body, headers["connection"]) == (200, b"one,two,three", "close")
        assert "transfer-encoding" not in headers


@pytest.mark.parametrize("loop", LOOPS)
def test_expect_100_continue_is_answered_when_the_app_reads(loop: str) -> None:
    with _server(loop) as server, _connect(server) as sock:
        reader = _Reader(sock)
        sock.sendall(
            b"POST /echo HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\n"
        )
        assert reader.response(head_only=True)[0] == 100
        sock.sendall(b"body")
        assert reader.response()[:3:2] == (200, b"body")


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("path", ["/raise", "/nothing", "/bad-header", "/too-long"])
def test_an_app_that_fails_before_answering_gives_a_json_500(loop: str, path: str) -> None:
    with _server(loop) as server, _connect(server) as sock:
        reader = _Reader(sock)
        sock.sendall(b"GET %s HTTP/1.1\r\nhost: x\r\n\r\n" % path.encode())
        status, headers, body = reader.response()
        assert (status, headers["content-type"], headers["connection"]) == (
            500,
            "application/json",
            "close",
        )
        assert orjson.loads(body)["error"]["type"] == "internal_error"
        assert reader.closed()


@pytest.mark.parametrize("loop", LOOPS)
def test_an_app_that_fails_half_way_gets_the_connection_closed(loop: str) -> None:
    with _server(loop) as server, _connect(server) as sock:
        sock.sendall(b"GET /raise-after-start HTTP/1.1\r\nhost: x\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b"4\r\npart\r\n")


def _seen_once_the_close_is_seen(server: ServerThread) -> list[str]:
    """What the app saw of a client that left (``/seen``), asked again until it saw something:
    it is told once the server sees the close."""
    with _connect(server) as sock:
        reader = _Reader(sock)
        for _ in range(200):
            sock.sendall(b"GET /seen HTTP/1.1\r\nhost: x\r\n\r\n")
            seen: list[str] = orjson.loads(reader.response()[2])["seen"]
            if seen:
                break
    return seen


@pytest.mark.parametrize("loop", LOOPS)
def test_the_app_sees_a_client_that_left_as_a_disconnect(loop: str) -> None:
    _seen.clear()
    with _server(loop) as server:
        with _connect(server) as sock:
            sock.sendall(b"GET /disconnect HTTP/1.1\r\nhost: x\r\n\r\n")
            assert b"open" in sock.recv(65536)
        seen = _seen_once_the_close_is_seen(server)
    assert seen == ["http.disconnect"]


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("pipelined", [False, True])
def test_the_disconnect_notice_comes_though_a_pipelined_request_paused_reading(
    loop: str, pipelined: bool
) -> None:
    # A request pipelined behind the first pauses reading; the client's leaving is seen only
    # while the connection is read, so a registered notice must have it read again.
    _seen.clear()
    with _server(loop) as server:
        with _connect(server) as sock:
            behind = b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n" if pipelined else b""
            sock.sendall(b"GET /notice HTTP/1.1\r\nhost: x\r\n\r\n" + behind)
            assert b"open" in sock.recv(65536)
        seen = _seen_once_the_close_is_seen(server)
    assert seen == ["notice"]


@pytest.mark.parametrize("loop", LOOPS)
def test_an_idle_kept_alive_connection_is_closed_after_the_keep_alive_timeout(loop: str) -> None:
    with _server(loop, ServerLimits(keep_alive_timeout=0.2)) as server, _connect(server) as sock:
        reader = _Reader(sock)
        sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\nx")
        assert reader.response()[2] == b"x"
        assert reader.closed()  # recv returns b"" once the server closes (socket timeout 10 s)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_request_begun_behind_an_answered_one_still_has_its_header_deadline(loop: str) -> None:
    # One read holds a whole request and the start of the next: once the first is answered,
    # the client owes the rest of the second, on the clock (not forever, holding a connection).
    with _server(loop, ServerLimits(header_timeout=0.3)) as server, _connect(server) as sock:
        reader = _Reader(sock)
        sock.sendall(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\nGET /slow HTTP/1.1\r\nx-a: b")
        assert reader.response()[2] == b"slow"
        status, headers, _ = reader.response()
        assert status == 408 and headers["content-type"] == "application/json"
        assert reader.closed()


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(
    "bad",
    [b"NOT HTTP AT ALL\r\n\r\n", b"GET /x HTTP/1.1\r\n" + b"x-h: v\r\n" * 9 + b"\r\n"],
    ids=["malformed", "too-many-headers"],
)
def test_an_error_in_a_pipelined_request_comes_after_the_answers_before_it(
    loop: str, bad: bytes
) -> None:
    with _server(loop, ServerLimits(max_headers=5)) as server, _connect(server) as sock:
        reader = _Reader(sock)
        sock.sendall(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n" + bad)
        assert reader.response()[:3:2] == (200, b"slow")  # whole, nothing inside it
        status, _, body = reader.response()
        assert status in (400, 431) and orjson.loads(body)["error"]["message"]
        assert reader.closed()


@pytest.mark.parametrize("loop", LOOPS)
def test_upgrade_is_ignored_and_a_body_after_it_is_never_taken_for_a_request(loop: str) -> None:
    upgrade = b"connection: upgrade\r\nupgrade: h2c\r\n"
    with _server(loop) as server, _connect(server) as sock:
        reader = _Reader(sock)
        # No body: served as plain HTTP, and the request pipelined behind it too.
        sock.sendall(
            b"GET /stream HTTP/1.1\r\nhost: x\r\n" + upgrade + b"\r\n"
            b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nok"
        )
        assert [reader.response()[2] for _ in range(2)] == [b"one,two,three", b"ok"]
    with _server(loop) as server, _connect(server) as sock:
        reader = _Reader(sock)
        # A body: llhttp would hand it over as the new protocol's bytes; refused instead, and
        # the request inside the body is never served.
        smuggled = b"GET /smuggled HTTP/1.1\r\nhost: x\r\n\r\n"
        sock.sendall(
            b"POST /echo HTTP/1.1\r\nhost: x\r\n"
            + upgrade
            + b"content-length: %d\r\n\r\n%s" % (len(smuggled), smuggled)
        )
        status, _, body = reader.response()
        assert status == 400 and "Upgrade" in orjson.loads(body)["error"]["message"]
        assert reader.closed()


@pytest.mark.parametrize("loop", LOOPS)
def test_trailers_never_reach_the_headers_and_an_endless_one_is_refused(loop: str) -> None:
    limits = ServerLimits(max_header_bytes=4096)
    with _server(loop, limits) as server, _connect(server) as sock:
        reader = _Reader(sock)
        sock.sendall(
            b"POST /headers HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
            b"2\r\nhi\r\n0\r\nauthorization: Bearer not-a-header\r\n\r\n"
        )
        status, _, body = reader.response()
        assert status == 200 and orjson.loads(body) == ["host", "transfer-encoding"]
        sock.sendall(
            b"POST /headers HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
            b"2\r\nhi\r\n0\r\nx-t: "
        )
        for _ in range(4):  # a trailer line that never ends
            sock.sendall(b"a" * 2048)
        status, _, body = reader.response()
        assert status == 431 and "trailers" in orjson.loads(body)["error"]["message"]


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET /echo HTTP/1.1\r\n", 400),  # no Host
        (b"GET /echo HTTP/1.1\r\nhost: a\r\nhost: b\r\n", 400),  # two
        (b"GET /echo HTTP/1.0\r\nhost: a\r\nhost: b\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n", 501),
        (b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip\r\n"
         b"transfer-encoding: chunked\r\n", 501),
        (b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: identity\r\n", 501),
    ],
)  # fmt: skip
def test_a_head_framed_against_rfc_9112_is_refused(loop: str, head: bytes, status: int) -> None:
    # Each was served (200): RFC 9112 asks 400 of a request with no Host or two (3.2), and 501
    # of a transfer coding the server does not apply (6.1): llhttp decoded the chunks and
    # ignored the gzip, so the app took compressed bytes for the body.
    with _server(loop) as server, _connect(server) as sock:
        sock.sendall(head + b"\r\n2\r\nhi\r\n0\r\n\r\n")
        got, _, body = _Reader(sock).response()
        assert got == status and orjson.loads(body)["error"]["message"]


@pytest.mark.parametrize("loop", LOOPS)
def test_an_http_1_0_request_may_omit_host(loop: str) -> None:
    with _server(loop) as server, _connect(server) as sock:
        sock.sendall(b"POST /echo HTTP/1.0\r\ncontent-length: 2\r\n\r\nok")
        assert _Reader(sock).response()[:3:2] == (200, b"ok")


def _where(server: ServerThread, request_line: bytes, host: bytes | None) -> Any:
    """The status of ``request_line`` sent with ``host`` (none if ``None``), and the server's
    error message, or what the app answered (``/where``: what it saw)."""
    with _connect(server) as sock:
        head = request_line + b"\r\n" + (b"host: " + host + b"\r\n" if host is not None else b"")
        sock.sendall(head + b"\r\n")
        status, _, body = _Reader(sock).response()
    answer = orjson.loads(body)
    return status, answer["error"]["message"] if "error" in answer else answer


_GOOD_HOSTS = [
    b"x",
    b"x:8000",
    b"api.example.com",
    b"a_b-c.local:1",
    b"127.0.0.1:65535",
    b"[::1]",
    b"[::1]:8000",
    b"[2001:db8::ffff:1.2.3.4]",
    b"[v1.fe80::a+en1]",
    b"caf%C3%A9.example",
]
_BAD_HOSTS = [b"a/b?c", b"x:", b"a b", b"user@x", b"x:99999", b"x:1:2", b"x:port", b"[::1",
              b"::1", b"[zz::1]", b"[::1]x", b"x%zz", b"", b"x#y", b"x\\y"]  # fmt: skip
_HOST_REFUSED = "the Host header must be a host name or an IP address, and a port"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_host_that_is_not_a_host_and_port_is_refused_with_400(loop: str) -> None:
    # Each bad one was served (200) with the Host as it came; RFC 9112 (3.2) asks 400 of a Host
    # with an invalid value.
    with _server(loop) as server:
        for host in _GOOD_HOSTS:
            status, seen = _where(server, b"GET /where HTTP/1.1", host)
            assert (status, seen["host"]) == (200, [host.decode()]), host
        for host in _BAD_HOSTS:
            status, message = _where(server, b"GET /where HTTP/1.1", host)
            assert (status, message) == (400, _HOST_REFUSED), host


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(
    ("target", "version", "host"),
    [
        (b"http://api.example.com:8080/where?a=1", b"1.1", b"other"),
        (b"HTTPS://API.example.com:8080/where?a=1", b"1.1", b"other"),
        (b"http://api.example.com:8080/where?a=1", b"1.0", None),  # 1.0 may omit the Host
    ],
)
def test_an_absolute_form_target_is_served_as_its_path_with_its_authority_as_host(
    loop: str, target: bytes, version: bytes, host: bytes | None
) -> None:
    # RFC 9112 3.2.2: a server MUST accept the absolute form, and MUST ignore the Host received
    # for the target's authority. The app was given the Host as it came ("other"): two
    # authorities that disagreed, and the app trusted the wrong one.
    with _server(loop) as server:
        status, seen = _where(server, b"GET " + target + b" HTTP/" + version, host)
    assert status == 200
    assert seen == {"host": [target.split(b"/")[2].decode()], "path": "/where", "query": "a=1"}


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(
    ("request_line", "words"),
    [
        (b"GET ftp://x/where HTTP/1.1", "an http or https URL"),
        (b"GET http:///where HTTP/1.1", "host"),
        (b"GET http://a/b@c/where HTTP/1.1", None),  # an @ in the path is no user information
        (b"GET http://user:secret@x/where HTTP/1.1", "user information"),
        (b"GET http://x:99999/where HTTP/1.1", "host"),
        (b"GET http://a/b?c/where HTTP/1.1", None),  # the authority is "a": served
        (b"GET /where#top HTTP/1.1", "fragment"),
        (b"GET http://x/where#top HTTP/1.1", "fragment"),
        (b"GET * HTTP/1.1", "* for OPTIONS"),
        (b"CONNECT x:443 HTTP/1.1", "an http or https URL"),
    ],
)
def test_a_request_target_of_no_form_a_server_serves_is_refused_with_400(
    loop: str, request_line: bytes, words: str | None
) -> None:
    with _server(loop) as server:
        status, answer = _where(server, request_line, b"x")
    if words is None:
        assert status == 404 and "seen" in answer  # served: the app answered its unknown path
    else:
        assert status == 400 and words in answer, answer


@pytest.mark.parametrize("loop", LOOPS)
def test_options_asterisk_reaches_the_app(loop: str) -> None:
    with _server(loop) as server, _connect(server) as sock:
        sock.sendall(b"OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n")
        assert _Reader(sock).response()[0] == 404  # the app's answer to a path it lacks


@pytest.mark.parametrize("loop", LOOPS)
def test_a_trailer_section_arriving_in_one_read_is_bounded_too(loop: str) -> None:
    # 200 trailer fields of 1 KB, sent at once: each field reset the count, and a section that
    # ended within one read was never counted (served with 200).
    limits = ServerLimits(max_header_bytes=16 * 1024)
    trailers = b"".join(b"x-t%d: %s\r\n" % (i, b"a" * 1000) for i in range(200))
    with _server(loop, limits) as server, _connect(server) as sock:
        sock.sendall(
            b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
            b"2\r\nhi\r\n0\r\n" + trailers + b"\r\n"
        )
        status, _, body = _Reader(sock).response()
        assert status == 431 and "trailers" in orjson.loads(body)["error"]["message"]


@pytest.mark.parametrize("loop", LOOPS)
def test_an_answer_before_the_body_with_connection_close_is_not_lost_to_a_reset(
    loop: str,
) -> None:
    # The app answers (404) without reading a 4 MB body the client sends whole before it reads
    # (with Connection: close, as urllib does). Closing at once with the body unread made the
    # kernel reset the connection: the client's send failed and the answer was lost.
    size = 4 * 1024 * 1024
    with _server(loop) as server, _connect(server) as sock:
        head = b"POST /nowhere HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
        sock.sendall(head + b"content-length: %d\r\n\r\n" % size + b"a" * size)
        status, _, body = _Reader(sock).response()
        assert status == 404 and b"seen" in body


def _trickle_until_closed(sock: socket.socket, piece: bytes, limit_s: float) -> float:
    """Send ``piece`` every 0.1 s until the server closes the connection (the send fails);
    the seconds that took, or ``limit_s`` if it never did."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        try:
            sock.sendall(piece)
        except OSError:
            return time.monotonic() - start
        time.sleep(0.1)  # the trickle's pace: the behaviour under test
    return limit_s


@pytest.mark.parametrize("loop", LOOPS)
def test_an_answer_before_a_trickling_body_ends_the_connection_within_the_linger_bound(
    loop: str,
) -> None:
    # The app answers (404) a chunked body it never reads, whose client sends one byte a tenth
    # of a second forever. The connection used to stay kept alive while the server read and
    # dropped the body to reach the next request: one connection held as long as the client
    # liked (30 of them held a 30-connection server). Now the answer says the connection ends
    # and the close lingers LINGER_S (2 s), however slowly the rest comes.
    with _server(loop) as server, _connect(server) as sock:
        sock.sendall(b"POST /nowhere HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        sock.sendall(b"1\r\na\r\n")
        status, headers, body = _Reader(sock).response()
        assert status == 404 and b"seen" in body
        assert headers["connection"] == "close"
        assert _trickle_until_closed(sock, b"1\r\na\r\n", 10.0) < 5.0


@pytest.mark.parametrize("loop", LOOPS)
def test_the_lingering_close_is_bounded_in_bytes_too(loop: str) -> None:
    # A client pushing an endless body as fast as it can is cut off after LINGER_BYTES dropped,
    # not read for the whole linger time.
    with _server(loop) as server, _connect(server) as sock:
        sock.sendall(b"POST /nowhere HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        assert _Reader(sock).response()[0] == 404
        piece = b"%x\r\n%s\r\n" % (1 << 20, b"a" * (1 << 20))
        sent, start = 0, time.monotonic()
        with contextlib.suppress(OSError):
            while time.monotonic() - start < 1.5:
                sock.sendall(piece)
                sent += len(piece)
        assert sent < 2 * LINGER_BYTES and time.monotonic() - start < 1.5


@pytest.mark.parametrize("loop", LOOPS)
def test_a_client_that_stops_reading_is_cut_off_after_the_send_timeout(loop: str) -> None:
    # The client asks for an endless response and never reads it. The app's send used to wait
    # for the socket to drain for ever, holding the connection and whatever the app kept for
    # the client (the gateway: a subscriber and its generation's log, past retention).
    _seen.clear()
    with _server(loop, ServerLimits(send_timeout=0.5)) as server, _connect(server) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"GET /flood HTTP/1.1\r\nhost: x\r\n\r\n")
        wait_until(lambda: "flood stopped" in _seen, 10, "the app told the client left")
        sock.settimeout(5)
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(1 << 20):  # what the kernel took before the abort, then the end
                pass


@pytest.mark.parametrize("loop", LOOPS)
def test_an_http_1_0_client_is_never_sent_100_continue(loop: str) -> None:
    with _server(loop) as server, _connect(server) as sock:
        reader = _Reader(sock)
        sock.sendall(
            b"POST /echo HTTP/1.0\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\nbody"
        )
        assert reader.response()[:3:2] == (200, b"body")


# -- writes per response, in process ---------------------------------------------------------------


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name in ("sockname", "peername") else default

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class _State:
    def __init__(self) -> None:
        self.connections: set[Any] = set()
        self.tasks: set[Any] = set()
        self.default_headers = [(b"server", b"test")]
        self.total_requests = 0


class _Config:
    loaded = True
    root_path = ""

    def __init__(self, app: Any) -> None:
        self.loaded_app = app


def _writes(make_app: Any) -> list[bytes]:
    """The transport writes of one GET answered by ``make_app(writes)``, an app that may look at
    what was written so far."""

    async def run() -> list[bytes]:
        state = _State()
        transport = _Transport()
        app = make_app(transport.writes)
        protocol = HttpProtocol(_Config(app), state, {}, asyncio.get_running_loop())
        protocol.connection_made(transport)
        protocol.data_received(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        await asyncio.gather(*state.tasks)
        protocol.connection_lost(None)
        return transport.writes

    return asyncio.run(run())


def test_a_start_followed_at_once_by_a_body_leaves_in_one_write() -> None:
    def make_app(writes: list[bytes]) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b""})

        return app

    writes = _writes(make_app)
    assert len(writes) == 2, writes  # head + first piece, then the end
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\nserver: test\r\n")
    assert writes[0].endswith(b"\r\n\r\n9\r\ndata: x\n\n\r\n") and writes[1] == b"0\r\n\r\n"


def test_a_start_alone_is_written_by_the_end_of_the_loop_iteration() -> None:
    seen: list[int] = []

    def make_app(writes: list[bytes]) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            seen.append(len(writes))  # held: a body may follow at once
            await asyncio.sleep(0)
            seen.append(len(writes))  # written: the head never waits for a late first body
            await send({"type": "http.response.body", "body": b"late"})

        return app

    writes = _writes(make_app)
    assert seen == [0, 1]
    assert writes[0].startswith(b"HTTP/1.1 200 OK") and writes[0].endswith(b"\r\n\r\n")
    assert writes[1:] == [b"4\r\nlate\r\n0\r\n\r\n"]


def test_the_body_writer_writes_only_inside_a_started_chunked_response() -> None:
    results: list[bool] = []

    def make_app(writes: list[bytes]) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            write = scope["extensions"]["streamsafe.body_writer"]
            results.append(write(b"early"))
            await send({"type": "http.response.start", "status": 200, "headers": []})
            results.append(write(b"a"))  # goes out with the held head
            await send({"type": "http.response.body", "body": b""})
            results.append(write(b"late"))

        return app

    writes = _writes(make_app)
    assert results == [False, True, False]
    assert writes[0].endswith(b"\r\n\r\n1\r\na\r\n") and writes[1:] == [b"0\r\n\r\n"]


def test_the_disconnect_notice_comes_once_for_a_client_that_left_mid_response() -> None:
    calls: list[str] = []

    async def run() -> None:
        started, left = asyncio.Event(), asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            notice = scope["extensions"]["streamsafe.on_disconnect"]
            notice(lambda: (calls.append(scope["path"]), left.set()))
            if scope["path"] == "/withdrawn":
                notice(None)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            started.set()
            await left.wait()
            notice(lambda: calls.append("after"))  # already gone: at once

        for path in ("/left", "/withdrawn"):
            started.clear()
            left.clear()
            state, transport = _State(), _Transport()
            protocol = HttpProtocol(_Config(app), state, {}, asyncio.get_running_loop())
            protocol.connection_made(transport)
            protocol.data_received(b"GET %s HTTP/1.1\r\nhost: x\r\n\r\n" % path.encode())
            await started.wait()
            protocol.connection_lost(None)
            protocol.connection_lost(None)  # told twice: still one notice
            if path == "/withdrawn":
                left.set()
            await asyncio.gather(*state.tasks)

    asyncio.run(run())
    assert calls == ["/left", "after", "after"]


def test_no_disconnect_notice_once_the_response_is_complete() -> None:
    calls: list[str] = []

    def make_app(writes: list[bytes]) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            scope["extensions"]["streamsafe.on_disconnect"](lambda: calls.append("left"))
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"done"})

        return app

    _writes(make_app)  # the connection closes after the answer
    assert calls == []


@pytest.mark.parametrize("loop", LOOPS)
def test_a_served_connection_leaves_nothing_for_the_garbage_collector(loop: str) -> None:
    # A connection and its requests must be freed by reference counting once closed: garbage
    # only the collector frees piles up in bursts, is promoted, and makes full collections
    # (which stall every stream) long.
    import gc

    from streamsafe.server.cycle import RequestCycle
    from streamsafe.server.protocol import HttpProtocol

    with _server(loop) as server:
        for _ in range(3):  # warm up: first-use allocations
            with _connect(server) as sock:
                sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\nx")
                _Reader(sock).response()
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for path in (b"/echo", b"/stream", b"/echo"):
                with _connect(server) as sock:
                    reader = _Reader(sock)
                    sock.sendall(
                        b"POST " + path + b" HTTP/1.1\r\nhost: x\r\ncontent-length: 1"
                        b"\r\nconnection: close\r\n\r\nx"
                    )
                    reader.response()
                    assert reader.closed()
            connections = server._server.server_state.connections
            # connection_lost runs soon after.
            wait_until(lambda: not connections, 10, "every connection lost")
            gc.collect()
            ours = (HttpProtocol, RequestCycle, httptools.HttpRequestParser)
            left = [type(o).__name__ for o in gc.garbage if isinstance(o, ours)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert left == []
