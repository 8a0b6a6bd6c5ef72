"""An upstream that records the paths it is sent, behind a gateway that passes through to it
under a path prefix: for the path-spelling tests (serving/test_paths.py) and their fuzzing
(test_fuzz.py)."""

from __future__ import annotations

import contextlib
import posixpath
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote_to_bytes

import orjson
from gateway_helpers import MODEL

from server_stops import stop_later
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread

PREFIX = "/tenant-x/api"
COMPLETION_ROUTES = ("/v1/chat/completions", "/v1/completions")
#: Sent by the test client on every request: pass-through forwards it, the gateway's own upstream
#: requests (for the routes it serves) never carry it.
PROBE = b"x-path-probe"
BODY = orjson.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
)
_ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
    }
)


@dataclass
class Recorder:
    """An upstream that records the raw path and headers of every request it is sent, and
    answers each with a chat completion."""

    seen: list[tuple[bytes, dict[bytes, bytes]]] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        self.seen.append((scope["raw_path"], dict(scope["headers"])))
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": _ANSWER})

    def probes(self) -> list[bytes]:
        """Raw paths of the requests passed through from the test client."""
        return [path for path, headers in self.seen if PROBE in headers]


def lenient(raw: bytes) -> str:
    """The path a lenient upstream routes ``raw`` to: every escape decoded (``%2F`` too),
    backslashes read as slashes, slashes merged, dot segments resolved (nginx does most of
    this; httpx resolves literal dot segments before it sends)."""
    path = unquote_to_bytes(raw).decode("utf-8", "replace").replace("\\", "/")
    path = "/".join(segment.partition(";")[0] for segment in path.split("/"))
    resolved = posixpath.normpath("/" + path)
    return "/" + resolved.lstrip("/")


@dataclass
class PathStack:
    recorder: Recorder
    gw: Gateway
    server: ServerThread

    def send(
        self, method: bytes, target: bytes, body: bytes = b"", key: bytes | None = None
    ) -> tuple[int, bytes]:
        """One request over a raw socket, the target as given (with API key ``key``); its
        status and body."""
        with socket.create_connection((self.server.host, self.server.port), timeout=10) as sock:
            head = b"%s %s HTTP/1.1\r\nhost: x\r\n%s: 1\r\nconnection: close\r\n" % (
                method,
                target,
                PROBE,
            )
            if key is not None:
                head += b"authorization: Bearer %s\r\n" % key
            if body:
                head += b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
            sock.sendall(head + b"\r\n" + body)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        status_line, _, rest = data.partition(b"\r\n")
        return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


@contextlib.contextmanager
def path_stack(**config_fields: Any) -> Iterator[PathStack]:
    """A gateway of the ``openai`` kind (completion routes served, the rest passed through) in
    front of a :class:`Recorder` under :data:`PREFIX`, with ``config_fields`` set."""
    recorder = Recorder()
    upstream = ServerThread(recorder).start()
    try:
        config = GatewayConfig(
            upstream=upstream.url + PREFIX, upstream_kind="openai", **config_fields
        )
        gw = Gateway(config)
        server = ServerThread(gw).start()
    except BaseException:
        upstream.stop()
        raise
    try:
        yield PathStack(recorder, gw, server)
    finally:
        stop_later(server, upstream)
