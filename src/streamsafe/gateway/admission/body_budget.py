"""The request bodies live generations hold, bounded as a whole.

A generation keeps its request body while it is queued or running (it is sent upstream when
admitted, and again for a continuation), and drops it when it ends. Each body is bounded by
``max_body_bytes``, but their number only by the queue and the running limit: 1,024 queued
4 MiB bodies held some 4 GB. :class:`BodyBudget` bounds their sum by ``max_live_body_bytes``
(:class:`~streamsafe.gateway.config.GatewayConfig`): a new generation whose body does not fit
is shed (429 with ``Retry-After``) before it is queued, as a full queue sheds it.

Fair across tenants, as the queue is: a tenant holding less than its share of the budget (the
budget over the tenants holding bodies, itself included) still gets its generation started,
so one tenant's large bodies cannot lock the others out; the sum then stays below twice the
budget. A body alone larger than the budget is never refused for it (``max_body_bytes`` bounds
it).
"""

from __future__ import annotations

__all__ = ["BodyBudget"]


class BodyBudget:
    """Bytes of request bodies held by live generations, per tenant and in all, against
    ``limit``. Pure bookkeeping: the registry asks :meth:`fits` before it starts a generation
    and calls :meth:`hold` and :meth:`drop` as generations start and end."""

    __slots__ = ("_held", "_tenants", "bytes", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: Bytes held in all.
        self.bytes = 0
        self._held: dict[str, tuple[str, int]] = {}  # generation id -> (tenant, bytes)
        self._tenants: dict[str, int] = {}  # tenant -> bytes it holds

    def fits(self, tenant: str, size: int) -> bool:
        """Whether a new generation of ``tenant`` with a body of ``size`` bytes may start."""
        if self.bytes + size <= self.limit or self.bytes == 0:
            return True
        holders = len(self._tenants) + (tenant not in self._tenants)
        return self._tenants.get(tenant, 0) + size <= self.limit / holders

    def hold(self, gen_id: str, tenant: str, size: int) -> None:
        """Generation ``gen_id`` of ``tenant`` went live holding ``size`` bytes of body."""
        if gen_id in self._held:
            return
        self._held[gen_id] = (tenant, size)
        self._tenants[tenant] = self._tenants.get(tenant, 0) + size
        self.bytes += size

    def drop(self, gen_id: str) -> None:
        """Generation ``gen_id`` is no longer live here: its body is let go."""
        held = self._held.pop(gen_id, None)
        if held is None:
            return
        tenant, size = held
        self.bytes -= size
        left = self._tenants[tenant] - size
        if left:
            self._tenants[tenant] = left
        else:
            del self._tenants[tenant]
