"""An upstream's odd answers reach the caller as clear JSON errors, never as they came: an HTML
error page from a proxy, a plain-text 400, a 204 or a redirect where a completion was due. An
interim ``100 Continue`` is skipped, as HTTP says, for the answer that follows it."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx2
import orjson
import pytest
from gateway_helpers import chat_body

from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread


def _chunk(delta: dict[str, str], finish: str | None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return orjson.dumps({"id": "x", "object": "chat.completion.chunk", "choices": [choice]})


_ROLE = _chunk({"role": "assistant", "content": ""}, None)
_LAST = _chunk({"content": "hi"}, "stop")


def _plain(status: int, ctype: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n%s\r\n"
        % (status, ctype, len(body), extra)
    ) + body


def _stream() -> bytes:
    events = b"".join(b"data: %s\n\n" % e for e in (_ROLE, _LAST, b"[DONE]"))
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(events), events)
    )


_COMPLETION = orjson.dumps(
    {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    }
)

#: What the upstream answers, by the request's message content.
ANSWERS: dict[str, bytes | tuple[bytes, bytes]] = {
    "html500": _plain(500, b"text/html", b"<html><body>Internal oops</body></html>"),
    "text400": _plain(400, b"text/plain", b"bad thing"),
    "r204": b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n",
    "r302": _plain(302, b"text/html", b"moved", b"location: http://127.0.0.1:1/\r\n"),
    # Sent in two writes, a pause between, so the interim head is read on its own.
    "continue_stream": (b"HTTP/1.1 100 Continue\r\n\r\n", _stream()),
    "continue_plain": (
        b"HTTP/1.1 100 Continue\r\n\r\n",
        _plain(200, b"application/json", _COMPLETION),
    ),
    "continue_only": b"HTTP/1.1 100 Continue\r\n\r\n",
}


@contextlib.contextmanager
def _upstream() -> Iterator[str]:
    """A loopback server answering each request, one per connection, from ``ANSWERS``."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            lengths = [
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ]
            if not lengths:  # a probe (/health, /v1/models): healthy
                conn.sendall(_plain(200, b"application/json", b'{"object":"list","data":[]}'))
                return
            while len(body) < lengths[0]:
                body += conn.recv(65536)
            answer = ANSWERS[orjson.loads(body)["messages"][0]["content"]]
            if isinstance(answer, tuple):
                interim, final = answer
                conn.sendall(interim)
                time.sleep(0.2)  # the upstream's pause between its answers: the behaviour
                conn.sendall(final)
            else:
                conn.sendall(answer)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
        listener.close()
        thread.join(10)


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    with _upstream() as upstream:
        config = GatewayConfig(upstream=upstream, upstream_kind="vllm", max_continuations=0)
        with ServerThread(Gateway(config)) as server:
            yield server.url


def _call(url: str, mode: str, stream: bool) -> httpx2.Response:
    body = chat_body(mode, stream=stream)
    with httpx2.Client(timeout=20) as client:
        return client.post(url + "/v1/chat/completions", json=body)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("mode", "status", "says"),
    [
        ("html500", 500, "Internal oops"),
        ("text400", 400, "bad thing"),
        ("r204", 502, "answered 204"),
        ("r302", 502, "answered 302"),
    ],
)
def test_an_upstream_answer_that_is_not_a_json_error_becomes_one(
    gateway: str, mode: str, status: int, says: str, stream: bool
) -> None:
    resp = _call(gateway, mode, stream)
    assert resp.status_code == status
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]  # the HTML page or the text itself was relayed before
    assert says in error["message"] and error["code"] == status


def test_an_interim_100_continue_is_skipped_for_the_answer_after_it(gateway: str) -> None:
    streamed = _call(gateway, "continue_stream", True)
    assert streamed.status_code == 200
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert '"content":"hi"' in streamed.text and streamed.text.rstrip().endswith("[DONE]")
    plain = _call(gateway, "continue_plain", False)
    assert plain.status_code == 200
    assert plain.json()["choices"][0]["message"]["content"] == "hi"


def test_an_upstream_that_sends_only_100_continue_gives_a_json_error(gateway: str) -> None:
    for stream in (True, False):
        resp = _call(gateway, "continue_only", stream)
        assert resp.status_code >= 500  # was a final "100 Continue" with an empty body
        assert "message" in resp.json()["error"]
