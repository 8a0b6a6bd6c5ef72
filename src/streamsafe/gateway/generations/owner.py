"""What the parts that run a generation tell the one that holds it: one narrow interface, given
once at construction, instead of a callback each (see docs/design.md, Coalescing).

The relay (:class:`~streamsafe.gateway.relay.relay.Relay` and the parts it reads a stream
with) and the grace periods (:class:`~streamsafe.gateway.abandonment.Abandonment`) end
generations; what an end means for the process (its live count, its request body, the
counters, its trace, replay or forgetting) is the owner's:
:class:`~streamsafe.gateway.generations.running.Running`. The owner sits below them, not
above: it never calls the relay or the registry back.
"""

from __future__ import annotations

from typing import Protocol

from streamsafe.gateway.errors import Failure
from streamsafe.gateway.generations.generation import Generation, State

__all__ = ["Owner"]


class Owner(Protocol):
    """Whoever holds the generations a part runs, told how each ended."""

    def end(self, gen: Generation, state: State, failure: Failure | None = None) -> None:
        """``gen`` ended in ``state`` (done, failed or aborted), with ``failure`` where its
        callers get a status and body instead of events: it is moved there
        (:meth:`Generation.end`), its subscribers woken, and it is kept for replay or
        forgotten. Nothing happens where it had ended already (an abort racing the relay's own
        end)."""

    def refused(self, gen: Generation) -> None:
        """``gen`` ended with the engine's refusal, which is its callers' answer: their
        retries get the same while the engine refuses (``engine_refusals`` ``answer``)."""
