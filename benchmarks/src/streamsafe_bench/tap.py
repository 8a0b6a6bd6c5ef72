"""A tap at the engine: when each event of each stream left the simulator.

A thin ASGI wrapper around the simulator notes, per request key (see
:func:`streamsafe_bench.load.request_body`), the time each SSE event was handed to the server.
The load generator notes when each arrived; the difference, through a proxy minus direct, is
what the proxy adds per chunk. Both clocks are ``time.perf_counter`` (``CLOCK_MONOTONIC`` on
Linux), which every process on the machine shares. Behind a pool of engines each engine has its
tap; :class:`Taps` reads them as one.
"""

from __future__ import annotations

import time
from collections import ChainMap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from streamsafe_bench.load import EVENT, key_of

__all__ = ["Tap", "Taps", "latencies"]


class Tap:
    """ASGI wrapper recording ``sent[key] = [departure time of each event]``."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sent: dict[str, list[float]] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/completions"):
            await self.app(scope, receive, send)
            return
        times: list[float] = []
        head = b""
        keyed = False

        async def tapped_receive() -> Any:
            nonlocal head, keyed
            message = await receive()
            if not keyed and message["type"] == "http.request":
                head += message.get("body", b"")
                key = key_of(head)
                if key is not None:
                    self.sent[key] = times
                    keyed = True
            return message

        async def tapped_send(message: Any) -> None:
            if message["type"] == "http.response.body":
                body = message.get("body", b"")
                if body:
                    n = body.count(EVENT)
                    if n:
                        times.extend([time.perf_counter()] * n)
            await send(message)

        await self.app(scope, tapped_receive, tapped_send)


class Taps:
    """The taps of several engines read as one: ``sent`` finds each stream's departures at
    whichever engine served it, and :meth:`served` says how the streams were shared out."""

    def __init__(self, taps: Sequence[Tap]) -> None:
        self.taps = tuple(taps)
        self.sent: Mapping[str, list[float]] = ChainMap(*(t.sent for t in self.taps))

    def served(self, keys: Iterable[str]) -> list[int]:
        """How many of the streams ``keys`` each engine served, in the order of the taps."""
        keys = list(keys)
        return [sum(1 for k in keys if k in t.sent) for t in self.taps]


def latencies(sent: Mapping[str, list[float]], arrivals: dict[str, list[float]]) -> list[float]:
    """Arrival minus departure of every event both sides saw, paired in order per stream (a
    proxy that drops the final ``[DONE]`` only shortens the pairing)."""
    out: list[float] = []
    for key, arrived in arrivals.items():
        out.extend(a - s for s, a in zip(sent.get(key, ()), arrived, strict=False))
    return out
