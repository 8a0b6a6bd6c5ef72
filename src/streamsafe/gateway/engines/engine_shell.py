"""One engine behind the gateway, as the I/O side holds it (see docs/design.md, Engine pool).

The pool's :class:`~streamsafe.gateway.engines.pool.Engine` is the pure view of an engine that
picks read (its spec, load, breaker, turn, said-full time); an :class:`EngineShell` is the whole
engine around it: that view, the :class:`~streamsafe.gateway.upstream.connection.Upstream` its
calls go through (connections, health probe, the breaker the pool reads), the load counts its
generations and routed calls add to, and its
:class:`~streamsafe.gateway.engines.refusal_gate.RefusalGate`. Every part of the gateway that
talks to an engine holds its shell, so nothing looks an engine's parts up by position.
"""

from __future__ import annotations

import dataclasses

from streamsafe.gateway.engines.pool import Counts, Engine, EngineSpec
from streamsafe.gateway.engines.refusal_gate import RefusalGate
from streamsafe.gateway.upstream.breaker import EngineBreaker
from streamsafe.gateway.upstream.connection import Upstream

__all__ = ["EngineShell"]


@dataclasses.dataclass(eq=False, slots=True)
class EngineShell:
    """One engine: the pool's pure view of it and the I/O around it (see the module).

    Compared by identity: one shell per engine for the gateway's life."""

    #: What the pool picks by (its load is :attr:`load`, its breaker :attr:`upstream`'s).
    core: Engine
    #: Its connections, health probe, kind and breaker.
    upstream: Upstream
    #: Engine memory held by the generations and routed calls sent to it now.
    load: Counts
    #: Its refused calls waiting together, one probe at a time.
    gate: RefusalGate

    @property
    def spec(self) -> EngineSpec:
        """What the operator said of it (``--upstream``)."""
        return self.core.spec

    @property
    def breaker(self) -> EngineBreaker:
        """Its breaker (the same the pool reads and its health probe holds)."""
        return self.core.breaker
