"""Injected faults: which ones a request draws, and the cut that drops its connection.

Faults come from :attr:`SimConfig.faults <streamsafe.engine_sim.config.SimConfig.faults>`, or
per request from an ``x-sim-fault`` header (comma-separated specs) where the config allows it.
Each is drawn with its probability from one seeded generator, so a run is repeatable.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from streamsafe.engine_sim.config import Fault, SimConfig

__all__ = ["Drawn", "FaultDraw", "StreamCut"]

_FAULT_HEADER = b"x-sim-fault"


class StreamCut(Exception):
    """Raised out of the app to make uvicorn drop the connection mid-body (a cut fault)."""


class _QuietCut(logging.Filter):
    # uvicorn logs every exception escaping an app; the cut is intended, so drop that record.
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, StreamCut)


_quiet_cut = _QuietCut()


@dataclass
class Drawn:
    """The faults one request drew: an error status (or a 200 whose first event is an error),
    a cut after so many events, a stall, a pause mid-stream, a reset before any answer, a hang,
    a malformed chunk, a missing ``[DONE]``, no answer at all, the engine's crash after so many
    events."""

    status: Fault | None = None
    error_event: Fault | None = None
    cut_after: int | None = None
    stall_s: float = 0.0
    pause_after: int | None = None
    pause_s: float = 0.0
    reset: bool = False
    hang_after: int | None = None
    malformed_after: int | None = None
    nodone: bool = False
    black_hole: bool = False
    crash_after: int | None = None


class FaultDraw:
    """Draws each request's faults from one generator seeded with ``config.seed``; safe from
    any thread."""

    def __init__(self, config: SimConfig) -> None:
        self._config = config
        self._rng = random.Random(config.seed)
        self._lock = threading.Lock()
        self._hits: dict[Fault, int] = {}  # of faults with a bound on their hits
        logging.getLogger("uvicorn.error").addFilter(_quiet_cut)

    def draw(self, headers: Iterable[tuple[bytes, bytes]], continuation: bool = False) -> Drawn:
        """The faults of a request with these headers (``continuation``: it continues a partial
        answer). Raises ``ValueError`` on a bad ``x-sim-fault`` spec."""
        faults = self._config.faults
        if self._config.fault_header:
            for name, value in headers:
                if name == _FAULT_HEADER:
                    specs = value.decode("latin-1").split(",")
                    faults = tuple(Fault.parse(s) for s in specs if s.strip())
        out = Drawn()
        if not faults:
            return out
        with self._lock:
            rng = self._rng
            hits = self._hits
            for fault in faults:
                if not fault.hits(continuation):
                    continue
                if fault.times is not None and hits.get(fault, 0) >= fault.times:
                    continue
                if rng.random() >= fault.probability:
                    continue
                if fault.times is not None:
                    hits[fault] = hits.get(fault, 0) + 1
                kind = fault.kind
                if kind == "status" and out.status is None and out.error_event is None:
                    out.status = fault
                elif kind == "errorevent" and out.status is None and out.error_event is None:
                    out.error_event = fault
                elif kind == "cut" and out.cut_after is None:
                    out.cut_after = rng.randint(fault.cut_low, fault.cut_high)
                elif kind == "stall":
                    out.stall_s += fault.stall_s
                elif kind == "pause" and out.pause_after is None:
                    out.pause_after = fault.after
                    out.pause_s = fault.stall_s
                elif kind == "reset":
                    out.reset = True
                elif kind == "hang" and out.hang_after is None:
                    out.hang_after = fault.after
                elif kind == "malformed" and out.malformed_after is None:
                    out.malformed_after = fault.after
                elif kind == "nodone":
                    out.nodone = True
                elif kind == "blackhole":
                    out.black_hole = True
                elif kind == "crash" and out.crash_after is None:
                    out.crash_after = fault.after
        return out
