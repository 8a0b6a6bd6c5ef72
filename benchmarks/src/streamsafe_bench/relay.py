"""``streamsafe bench relay``: the Python a relayed chunk costs, in process, against python-floor.

``bench peers`` measures whole processes, where the kernel's share (a ``read`` and a ``write``
per chunk, the same for every proxy) and the machine's noise hide small steps. This benchmark
takes the system calls away: both relays run in this process on transports that only count
what is written to them, and are driven through their real entry points (the server's protocol
gets the client's request, the upstream connection the engine's bytes). Per chunk it times the
upstream read callback's work up to the client write: for streamsafe's gateway, the HTTP chunk
parse, the SSE check, the log append, the ``id:`` framing and the fan-out's write; for
python-floor (:mod:`streamsafe_bench.floor_relay`), the parse and one write. Best of several
rounds, interleaved; every chunk must reach its client, or the run fails.

A caveat the figures need: here the interpreter's caches stay warm between chunks. In a real
process the kernel's network work between two chunks evicts them, and the same Python costs
several times as much (see docs/benchmarks.md, Peers).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

import orjson

from streamsafe_bench.report import add_output_flags, write_json

__all__ = ["register", "run"]

_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
_ROLE = b'{"id":"chatcmpl-b","object":"chat.completion.chunk","created":1733000000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}'  # noqa: E501
_TOKEN = b'{"id":"chatcmpl-b","object":"chat.completion.chunk","created":1733000000,"model":"m","choices":[{"index":0,"delta":{"content":"tok%d "},"logprobs":null,"finish_reason":null}]}'  # noqa: E501


class _Transport(asyncio.Transport):
    """Takes writes and counts them; never blocks, never closes by itself."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.closing = False

    def write(self, data: Any) -> None:
        self.writes += 1

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name in ("sockname", "peername") else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _State:
    """What uvicorn's ``Server`` shares with its protocols."""

    def __init__(self) -> None:
        self.connections: set[Any] = set()
        self.tasks: set[Any] = set()
        self.default_headers = [(b"server", b"bench")]
        self.total_requests = 0


def _chunk(payload: bytes) -> bytes:
    event = b"data: %s\n\n" % payload
    return b"%x\r\n%s\r\n" % (len(event), event)


async def _connected(
    loop: asyncio.AbstractEventLoop, start: Callable[[], None], streams: int
) -> list[tuple[asyncio.Protocol, _Transport]]:
    """The upstream connections a relay opens once ``start`` sent its clients' requests: the
    loop's ``create_connection`` hands each a counting transport instead of a socket."""
    opened: list[tuple[asyncio.Protocol, _Transport]] = []

    async def create_connection(factory: Any, *args: Any, **kwargs: Any) -> Any:
        protocol, transport = factory(), _Transport()
        protocol.connection_made(transport)
        opened.append((protocol, transport))
        return transport, protocol

    loop.create_connection = create_connection  # type: ignore[method-assign,assignment]
    start()
    for _ in range(200):
        if len(opened) == streams:
            break
        await asyncio.sleep(0)
    if len(opened) != streams:
        raise RuntimeError(f"{len(opened)} of {streams} upstream requests were made")
    for protocol, _ in opened:
        protocol.data_received(_HEAD)
        protocol.data_received(_chunk(_ROLE))
    return opened


#: A relay under test: its upstream connections, its clients' transports, its client protocols.
_Relay = tuple[list[Any], list[_Transport], list[asyncio.Protocol]]


async def _gateway(streams: int) -> _Relay:
    from streamsafe.gateway import Gateway, GatewayConfig
    from streamsafe.server import server_config

    gateway = Gateway(GatewayConfig(upstream="http://127.0.0.1:9", upstream_kind="vllm"))
    config = server_config(gateway, log_level="warning", loop="uvloop", limits=None)
    config.load()
    state, clients = _State(), [_Transport() for _ in range(streams)]
    servers: list[asyncio.Protocol] = []
    body = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    )
    request = b"POST /v1/chat/completions HTTP/1.1\r\nhost: b\r\ncontent-type: application/json"
    request += b"\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    loop = asyncio.get_running_loop()

    protocol_class: Any = config.http_protocol_class

    def start() -> None:
        for client in clients:
            protocol = protocol_class(config, state, {}, loop)
            protocol.connection_made(client)
            protocol.data_received(request)
            servers.append(protocol)

    upstreams = await _connected(loop, start, streams)
    return [protocol for protocol, _ in upstreams], clients, servers


async def _floor(streams: int) -> _Relay:
    from streamsafe_bench.floor_relay import client_protocol

    clients = [_Transport() for _ in range(streams)]
    servers: list[asyncio.Protocol] = []
    request = b"POST /v1/chat/completions HTTP/1.1\r\nhost: b\r\ncontent-length: 2\r\n\r\n{}"

    def start() -> None:
        for client in clients:
            protocol = client_protocol(("127.0.0.1", 9))
            protocol.connection_made(client)
            protocol.data_received(request)
            servers.append(protocol)

    upstreams = await _connected(asyncio.get_running_loop(), start, streams)
    return [protocol for protocol, _ in upstreams], clients, servers


async def _measure(streams: int, chunks: int, rounds: int) -> dict[str, Any]:
    relays = {"streamsafe": await _gateway(streams), "python-floor": await _floor(streams)}
    try:
        best = await _time(relays, streams, chunks, rounds)
        for name, (_, clients, _) in relays.items():
            written = sum(c.writes for c in clients)  # one write per chunk once warmed up
            if written < streams * chunks * rounds:
                msg = f"{name}: {written} writes for {streams * chunks * rounds} chunks"
                raise RuntimeError(msg)
    finally:
        await _close(relays)
    ours, floor = best["streamsafe"], best["python-floor"]
    return {"streams": streams, "streamsafe_ns": ours, "floor_ns": floor, "ratio": ours / floor}


async def _time(
    relays: dict[str, _Relay], streams: int, chunks: int, rounds: int
) -> dict[str, float]:
    """Best ns per chunk of each relay, rounds interleaved."""
    reads = [[_chunk(_TOKEN % (i * chunks + k)) for k in range(chunks)] for i in range(streams)]
    for upstreams, _, _ in relays.values():  # warm-up: the subscribers join the fan-out
        for k in range(min(50, chunks)):
            for up in upstreams:
                up.data_received(reads[0][k])
        for _ in range(50):
            await asyncio.sleep(0)
    best = dict.fromkeys(relays, float("inf"))
    for _ in range(rounds):
        for name, (upstreams, _, _) in relays.items():
            gc.collect()
            t0 = time.perf_counter_ns()
            for k in range(chunks):
                for i, up in enumerate(upstreams):
                    up.data_received(reads[i][k])
            best[name] = min(best[name], (time.perf_counter_ns() - t0) / (chunks * streams))
            await asyncio.sleep(0)
    return best


async def _close(relays: dict[str, _Relay]) -> None:
    """The clients and the engine leave; whatever still runs is cancelled and awaited."""
    for upstreams, _, servers in relays.values():
        for protocol in (*servers, *upstreams):
            protocol.connection_lost(None)
    for _ in range(20):
        await asyncio.sleep(0)
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


def run(streams: tuple[int, ...] = (1, 50), chunks: int = 5000, rounds: int = 7) -> dict[str, Any]:
    """Measure each stream count in a fresh event loop; return the report."""
    try:
        import uvloop

        new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - platform without uvloop
        new_loop = asyncio.new_event_loop
    cases = []
    for n in streams:
        loop = new_loop()
        try:
            cases.append(loop.run_until_complete(_measure(n, chunks, rounds)))
        finally:
            loop.close()
    return {"bench": "relay", "chunks": chunks, "rounds": rounds, "cases": cases}


def _print(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Relay in process, ns of Python per chunk ({report['chunks']} chunks per stream, "
        f"best of {report['rounds']})"
    )
    for col in ("streams", "streamsafe", "python-floor", "ratio"):
        table.add_column(col, justify="right")
    for c in report["cases"]:
        table.add_row(
            str(c["streams"]),
            f"{c['streamsafe_ns']:,.0f}",
            f"{c['floor_ns']:,.0f}",
            f"{c['ratio']:.2f}x",
        )
    Console().print(table)


def _main(args: argparse.Namespace) -> int:
    streams = tuple(int(n) for n in args.streams.split(","))
    report = run(streams, args.chunks, args.rounds)
    _print(report)
    write_json(args.json, report)
    return 0


def register(subparsers: Any) -> None:
    """Add ``bench relay``."""
    p = subparsers.add_parser(
        "relay", help="Python per relayed chunk, in process: the gateway vs python-floor"
    )
    p.add_argument("--streams", default="1,50", help="stream counts, comma-separated (1,50)")
    p.add_argument("--chunks", type=int, default=5000, help="chunks per stream (default 5000)")
    p.add_argument("--rounds", type=int, default=7, help="rounds; the best is kept (default 7)")
    add_output_flags(p)
    p.set_defaults(func=_main)
