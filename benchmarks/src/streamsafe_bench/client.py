"""``streamsafe bench client``: chunks per second from bytes to typed chunk objects, streamsafe's
:class:`~streamsafe.client.Stream` against openai-python's ``Stream``.

Both read the same recorded chat stream (10,000 chunks by default) from an in-memory
``httpx2.Response`` in one process, so the network is out of the picture and only the client's
per-chunk path is measured: SSE decode, JSON parse, typed object. Rounds alternate between the
two so that machine noise hits both alike; the best round of each counts. Two depths: building
the objects only, and building them and reading ``choices[0].delta.content`` (what a caller
does with every chunk; openai-python's pydantic models are built in full either way, streamsafe's
wrap the parsed dict lazily).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import httpx2

from streamsafe_bench.recorded import recorded_chat_stream
from streamsafe_bench.report import add_output_flags, write_json

if TYPE_CHECKING:
    from streamsafe.client import ChatCompletionChunk, Stream

__all__ = ["register", "run"]

_URL = "http://bench.invalid/v1/chat/completions"


class _Replay(httpx2.SyncByteStream):
    def __init__(self, reads: list[bytes]) -> None:
        self._reads = reads

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._reads)


def _response(reads: list[bytes]) -> httpx2.Response:
    return httpx2.Response(
        200,
        headers={"content-type": "text/event-stream"},
        stream=_Replay(reads),
        request=httpx2.Request("POST", _URL),
    )


def _streamsafe_open(reads: list[bytes]) -> Stream[ChatCompletionChunk]:
    """A streaming chat call of streamsafe's client whose answer is ``reads``: the stream a
    caller gets, opened through the client as every stream is (its call, its resume path), on
    an in-process transport."""
    from streamsafe.client import Client

    def answer(request: httpx2.Request) -> httpx2.Response:
        return _response(reads)

    http = httpx2.Client(transport=httpx2.MockTransport(answer))
    client = Client(base_url="http://bench.invalid/v1", http_client=http)
    messages = [{"role": "user", "content": "bench"}]
    return client.chat.completions.create(model="bench", messages=messages, stream=True)


def _streamsafe(stream: Stream[ChatCompletionChunk], read_content: bool) -> int:
    n = 0
    for chunk in stream:
        if read_content:
            _ = chunk.choices[0].delta.content
        n += 1
    return n


def _openai_stream_factory() -> Callable[[list[bytes], bool], int]:
    from openai import OpenAI, Stream
    from openai.types.chat import ChatCompletionChunk

    client = OpenAI(api_key="bench", base_url="http://bench.invalid/v1")

    def consume(reads: list[bytes], read_content: bool) -> int:
        n = 0
        stream = Stream(cast_to=ChatCompletionChunk, response=_response(reads), client=client)
        for chunk in stream:
            if read_content:
                _ = chunk.choices[0].delta.content
            n += 1
        return n

    return consume


def run(n_chunks: int = 10_000, rounds: int = 5) -> dict[str, Any]:
    """Measure; return a report dict (chunks/s for each client and their ratio per case)."""
    openai_consume = _openai_stream_factory()
    cases = []
    for coalesce in (1, 16):
        reads = recorded_chat_stream(n_chunks, coalesce=coalesce)
        for read_content in (False, True):
            ours_t = theirs_t = float("inf")
            count = 0
            for _ in range(rounds):
                stream = _streamsafe_open(reads)  # the request is not the per-chunk path
                t0 = time.perf_counter()
                count = _streamsafe(stream, read_content)
                ours_t = min(ours_t, time.perf_counter() - t0)
                t0 = time.perf_counter()
                theirs = openai_consume(reads, read_content)
                theirs_t = min(theirs_t, time.perf_counter() - t0)
                if theirs != count:
                    raise AssertionError(f"clients disagree: {count} vs {theirs} chunks")
            cases.append(
                {
                    "events_per_read": coalesce,
                    "read_content": read_content,
                    "chunks": count,
                    "streamsafe_chunks_per_s": count / ours_t,
                    "openai_chunks_per_s": count / theirs_t,
                    "ratio": theirs_t / ours_t,
                }
            )
    return {"bench": "client", "n_chunks": n_chunks, "rounds": rounds, "cases": cases}


def _print(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Client stream, bytes -> typed chunks, {report['n_chunks']} chat chunks "
        f"(best of {report['rounds']})"
    )
    for col in ("events/read", "read content", "streamsafe chunks/s", "openai chunks/s", "ratio"):
        table.add_column(col, justify="right")
    for c in report["cases"]:
        table.add_row(
            str(c["events_per_read"]),
            "yes" if c["read_content"] else "no",
            f"{c['streamsafe_chunks_per_s']:,.0f}",
            f"{c['openai_chunks_per_s']:,.0f}",
            f"{c['ratio']:.2f}x",
        )
    Console().print(table)


def _main(args: argparse.Namespace) -> int:
    report = run(args.chunks, args.rounds)
    _print(report)
    write_json(args.json, report)
    return 0


def register(subparsers: Any) -> None:
    """Add ``bench client``."""
    p = subparsers.add_parser(
        "client", help="client stream parsing: streamsafe vs openai-python, as a ratio"
    )
    p.add_argument("--chunks", type=int, default=10_000, help="chat chunks in the stream")
    p.add_argument("--rounds", type=int, default=5, help="rounds; the best of each is kept")
    add_output_flags(p)
    p.set_defaults(func=_main)
