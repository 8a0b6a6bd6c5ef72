"""The engine out of service as a whole: silent (a black hole, ``SimConfig.black_hole`` or one
request's ``blackhole`` fault) or in a failing period of its flapping schedule
(``SimConfig.flap``).

Every route but ``/stats`` meets it (a test reads that to see what reached the engine). A
completion request is counted first, by the model it names, then meets it like any other.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal

from streamsafe.engine_sim.config import SimConfig
from streamsafe.engine_sim.engine import Engine
from streamsafe.engine_sim.faults import StreamCut
from streamsafe.engine_sim.wire import error_body
from streamsafe.server.asgi import Receive, Scope, Send, reset_connection, respond

__all__ = ["Outage", "Outages"]


@dataclass(frozen=True)
class Outage:
    """What a request arriving now meets: ``silent`` (no answer, not even a status line, until
    the client leaves), ``503`` (with ``Retry-After: 1``) or ``reset`` (TCP RST), for
    ``left_s`` more seconds."""

    how: Literal["silent", "503", "reset"]
    left_s: float = math.inf


class Outages:
    """The outages of one simulator, its flapping schedule timed from its creation."""

    def __init__(self, config: SimConfig, engine: Engine) -> None:
        self._config = config
        self._engine = engine
        self._born = time.monotonic()

    def now(self) -> Outage | None:
        """The outage of the whole engine now; ``None`` while it serves."""
        if self._config.black_hole:
            return Outage("silent")
        flap = self._config.flap
        if flap is not None:
            left = flap.down_for(time.monotonic() - self._born)
            if left > 0:
                return Outage(flap.failure, left)
        return None

    async def meet(self, outage: Outage, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a request as ``outage`` says (counted under ``faults_injected``)."""
        engine = self._engine
        if outage.how == "silent":
            engine.count("faults_blackhole")
            await _until_gone(receive)
            return
        engine.count("faults_flap")
        if outage.how == "reset":
            reset = reset_connection(scope)
            if reset is None:
                raise StreamCut("injected fault: flapping (this server cannot reset; closing)")
            reset()
            return
        message = f"injected fault: the engine is down for {outage.left_s:.3g} s more (flapping)"
        await respond(send, 503, error_body(message, 503), headers=[(b"retry-after", b"1")])


async def _until_gone(receive: Receive) -> None:
    """Read until the client leaves (the request's body, then nothing until it disconnects)."""
    while (await receive())["type"] != "http.disconnect":
        pass
