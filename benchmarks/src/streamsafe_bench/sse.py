"""``streamsafe bench sse``: streamsafe's SSE decoder against openai-python's ``SSEDecoder``.

Both decode the same recorded stream (10,000 chat chunks by default) in the same process, best of
several rounds each, interleaved so that machine noise hits both alike. Two shapes of input: one
event per network read (vLLM's flushing) and 16 events per read (a proxy or slow reader). Two
framings: vLLM's (``data:`` lines only) and the gateway's (``id: n`` on every event). Two
depths: events only, and events with their payload as ``str`` (what openai-python's decoder
always builds; streamsafe builds it only when asked, and its client never does).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import time
from collections.abc import Callable
from typing import Any

from streamsafe.sse import SSEDecoder
from streamsafe_bench.recorded import recorded_chat_stream
from streamsafe_bench.report import add_output_flags, write_json

__all__ = ["register", "run"]


def _streamsafe(chunks: list[bytes], with_text: bool) -> int:
    dec = SSEDecoder()
    n = 0
    for chunk in chunks:
        for ev in dec.feed(chunk):
            if with_text:
                _ = ev.data
            n += 1
    dec.close()
    return n


def _openai(chunks: list[bytes], with_text: bool) -> int:
    from openai._streaming import SSEDecoder as OpenAIDecoder

    n = 0
    for ev in OpenAIDecoder().iter_bytes(iter(chunks)):
        if with_text:
            _ = ev.data
        n += 1
    return n


def _best(fn: Callable[[], int], rounds: int) -> tuple[float, int]:
    best = float("inf")
    count = 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        count = fn()
        best = min(best, time.perf_counter() - t0)
    return best, count


def run(n_chunks: int = 10_000, rounds: int = 7) -> dict[str, Any]:
    """Measure; return a report dict (events/s for each decoder and their ratio per case)."""
    cases = []
    for framing, coalesce in itertools.product(("vllm", "gateway"), (1, 16)):
        chunks = recorded_chat_stream(n_chunks, coalesce=coalesce, with_ids=framing == "gateway")
        for with_text in (False, True):
            ours_t = theirs_t = float("inf")
            events = 0
            for _ in range(rounds):  # interleave, so noise hits both alike
                t, events = _best(functools.partial(_streamsafe, chunks, with_text), 1)
                ours_t = min(ours_t, t)
                t, theirs_events = _best(functools.partial(_openai, chunks, with_text), 1)
                theirs_t = min(theirs_t, t)
                if theirs_events != events:
                    raise AssertionError(f"decoders disagree: {events} vs {theirs_events}")
            cases.append(
                {
                    "framing": framing,
                    "events_per_read": coalesce,
                    "payload_as_str": with_text,
                    "events": events,
                    "streamsafe_events_per_s": events / ours_t,
                    "openai_events_per_s": events / theirs_t,
                    "ratio": theirs_t / ours_t,
                }
            )
    return {"bench": "sse", "n_chunks": n_chunks, "rounds": rounds, "cases": cases}


def _print(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"SSE decode, {report['n_chunks']} chat chunks (best of {report['rounds']})"
    )
    for col in (
        "framing",
        "events/read",
        "payload as str",
        "streamsafe ev/s",
        "openai ev/s",
        "ratio",
    ):
        table.add_column(col, justify="right")
    for c in report["cases"]:
        table.add_row(
            c["framing"],
            str(c["events_per_read"]),
            "yes" if c["payload_as_str"] else "no",
            f"{c['streamsafe_events_per_s']:,.0f}",
            f"{c['openai_events_per_s']:,.0f}",
            f"{c['ratio']:.2f}x",
        )
    Console().print(table)


def _main(args: argparse.Namespace) -> int:
    report = run(args.chunks, args.rounds)
    _print(report)
    write_json(args.json, report)
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("sse", help="SSE decoder: streamsafe vs openai-python, as a ratio")
    p.add_argument("--chunks", type=int, default=10_000, help="chat chunks in the stream")
    p.add_argument("--rounds", type=int, default=7, help="rounds; the best of each is kept")
    add_output_flags(p)
    p.set_defaults(func=_main)
