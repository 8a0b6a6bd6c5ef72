"""The fair queue of admission, sans-I/O: which waiting generation enters the engine next.

Two limits: generations running at once, and an estimate of engine memory (prompt tokens plus
max_tokens, the most a request can hold in the KV cache). What does not fit waits in a bounded
queue.

Fairness (docs/design.md, Admission). One tenant must not fill the queue or the engine and starve
the others:

- **order**: start-time fair queueing. Each waiter gets a virtual start tag, ``max(V, F_t)``,
  where ``V`` is the tag of the last admitted waiter and ``F_t`` the finish tag of its tenant's
  previous request (start plus cost divided by the tenant's weight). Waiters are admitted in tag
  order, so a tenant that sent 500 requests does not stand before one that sent 1, and tenants
  share the engine in proportion to their weights. Within a tenant the order is its arrival order.
- **in-flight share**: a tenant below its weighted share of the limits goes before one above it,
  so a newcomer gets a place as soon as one frees, whatever the tags say.
- **queue share**: when the queue is full, a tenant below its share of it still gets a place: the
  newest uncommitted waiter of the tenant furthest over its share is shed instead.
- **work-conserving**: nothing is held back for fairness' sake; a tenant alone may use everything.
  The next waiter in order that does not fit blocks those behind it (no bypass), so a large
  request is not starved by small ones.

A waiter whose subscribers all left is *dormant*: it keeps its place (its tag) but is skipped,
so the engine never works for nobody; if a subscriber comes back within the grace period it is
admitted at the next free place. A waiter whose client was told to come back (``expected``) is
dormant too, but it runs ahead where the engine would otherwise idle: its client replays it.

The wait is predicted from the drain rate (Little's law: generations in flight divided by their
mean duration), so a request that will not fit is answered with a real 429 before anything is
committed. A committed waiter is never shed: it waits its turn.

:class:`AdmissionCore` takes clock readings as arguments and holds opaque tokens; the event-loop
shell is :class:`~streamsafe.gateway.admission.admission.Admission`.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping
from typing import Any

__all__ = ["ADMITTED", "GONE", "QUEUED", "SHED", "AdmissionCore", "Waiter"]

#: Weight of the newest duration in the moving mean of generation durations: about the last 16
#: generations (one batch of a typical engine) make the estimate, so it follows a change of load
#: within a batch without jumping on one odd request.
_DURATION_ALPHA = 1 / 16

QUEUED = "queued"
ADMITTED = "admitted"
SHED = "shed"
GONE = "gone"


@dataclasses.dataclass(eq=False, slots=True)
class Waiter:
    """One generation's place in admission: queued, admitted (holding ``cost``), shed (refused
    or evicted from the queue) or gone (released or withdrawn). ``token`` is the shell's."""

    tenant: str
    cost: int
    token: Any
    seq: int
    #: Virtual start tag: the fair order.
    tag: float
    #: Clock reading when it asked for admission.
    since: float
    state: str = QUEUED
    #: False while nobody waits for it (dormant: skipped, but keeps its place).
    active: bool = True
    #: Dormant because its client was told to come back: it may run ahead while the engine
    #: would otherwise idle (its client then replays it).
    expected: bool = False
    #: True once a response was committed for it: never shed after that.
    committed: bool = False
    admitted_at: float | None = None


@dataclasses.dataclass(slots=True)
class _Tenant:
    name: str
    weight: float
    queue: deque[Waiter] = dataclasses.field(default_factory=deque)
    inflight: int = 0
    memory: int = 0
    #: Finish tag of the tenant's latest request.
    finish: float = 0.0
    #: Active (not dormant) waiters in ``queue``.
    active: int = 0


class AdmissionCore:
    """The admission decision, with no I/O and no clock of its own.

    Invariants (checked by the property tests): ``inflight <= max_inflight``,
    ``memory <= max_memory_tokens`` (where set) and ``queued <= queue_size`` after every call;
    whenever an active waiter is queued, the next one in the fair order does not fit (in
    particular something is in flight: the engine never idles while somebody waits).

    Every method that changes the state returns the waiters whose state it changed besides the
    one it was called for (admitted from the queue, or shed from it), for the shell to wake.
    """

    def __init__(
        self,
        max_inflight: int | None,
        max_memory_tokens: int | None,
        queue_size: int,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        self.max_inflight = max_inflight
        self.max_memory_tokens = max_memory_tokens
        self.queue_size = queue_size
        self.weights = dict(weights or {})
        self.inflight = 0
        self.memory = 0
        #: Waiters in the queue, dormant ones included.
        self.queued = 0
        self._tenants: dict[str, _Tenant] = {}
        self._vtime = 0.0
        self._seq = 0
        #: Moving mean of how long an admitted generation holds its place (seconds).
        self.mean_duration: float | None = None

    # -- queries ----------------------------------------------------------------------------------

    def can_ever_fit(self, cost: int) -> bool:
        """False if ``cost`` exceeds the whole memory budget: waiting would never help."""
        return self.max_memory_tokens is None or cost <= self.max_memory_tokens

    def tenant_counts(self, tenant: str) -> tuple[int, int]:
        """(in flight, queued) of ``tenant``."""
        t = self._tenants.get(tenant)
        return (0, 0) if t is None else (t.inflight, len(t.queue))

    def drain_rate(self) -> float | None:
        """Places freed per second while saturated (generations in flight over their mean
        duration); ``None`` before any generation has finished or while none is in flight."""
        if self.mean_duration is None or self.inflight == 0:
            return None
        return self.inflight / max(self.mean_duration, 1e-3)

    def predicted_wait(self, waiter: Waiter | None = None, tenant: str = "") -> float | None:
        """Seconds until ``waiter`` (or a request of ``tenant`` arriving now) is expected to be
        admitted: the active and expected waiters before it in the fair order, plus itself,
        divided by the drain rate. 0 for an admitted waiter; ``None`` while the rate is
        unknown."""
        if waiter is not None and waiter.state != QUEUED:
            return 0.0
        if waiter is None:
            t = self._tenants.get(tenant)
            key = (max(self._vtime, t.finish if t is not None else 0.0), self._seq)
            if not self._any_active() and self.fits(0):
                return 0.0
        else:
            key = (waiter.tag, waiter.seq)
        rate = self.drain_rate()
        if rate is None:
            return None
        ahead = 0
        for t in self._tenants.values():
            for w in t.queue:
                if (w.active or w.expected) and (w.tag, w.seq) < key:
                    ahead += 1
        return (ahead + 1) / rate

    # -- changes ----------------------------------------------------------------------------------

    def request(
        self, tenant: str, cost: int, token: Any, now: float
    ) -> tuple[Waiter, list[Waiter]]:
        """A generation of ``cost`` asks for a place. The returned waiter is admitted at once,
        queued, or shed (the queue is full and its tenant is at its share of it)."""
        t = self._tenants.get(tenant)
        if t is None:
            t = self._tenants[tenant] = _Tenant(tenant, self.weights.get(tenant, 1.0))
        self._seq += 1
        tag = max(self._vtime, t.finish)
        waiter = Waiter(tenant, cost, token, self._seq, tag, now)
        t.finish = tag + cost / t.weight
        t.queue.append(waiter)
        t.active += 1
        self.queued += 1
        changed = self._drain(now)
        if waiter in changed:
            changed.remove(waiter)
        if waiter.state == QUEUED and self.queued > self.queue_size:
            victim = self._victim(waiter)
            self._unqueue(victim, refund=True)
            victim.state = SHED
            if victim is not waiter:
                changed.append(victim)
        return waiter, changed

    def withdraw(self, waiter: Waiter, now: float) -> list[Waiter]:
        """Take a queued waiter out (timed out, shed, abandoned); returns the waiters admitted
        because the order changed. No effect on a waiter that is not queued."""
        if waiter.state != QUEUED:
            return []
        self._unqueue(waiter, refund=True)
        waiter.state = GONE
        return self._drain(now)

    def release(self, waiter: Waiter, now: float, *, ran: bool = True) -> list[Waiter]:
        """An admitted waiter gave its place back at ``now``; ``ran``: it held the place for
        real work (its duration feeds the drain rate). Returns the waiters admitted in its
        place. No effect on a waiter that is not admitted."""
        if waiter.state != ADMITTED:
            return []
        waiter.state = GONE
        t = self._tenants[waiter.tenant]
        t.inflight -= 1
        t.memory -= waiter.cost
        self.inflight -= 1
        self.memory -= waiter.cost
        if ran and waiter.admitted_at is not None:
            took = max(0.0, now - waiter.admitted_at)
            mean = self.mean_duration
            self.mean_duration = took if mean is None else mean + _DURATION_ALPHA * (took - mean)
        self._prune(t)
        return self._drain(now)

    def set_active(
        self, waiter: Waiter, active: bool, now: float, *, expected: bool = False
    ) -> list[Waiter]:
        """Mark a queued waiter dormant (nobody waits for it: skipped, place kept; with
        ``expected``, its client was told to come back) or active again; returns the waiters
        admitted as a result (it may be one of them)."""
        if waiter.state != QUEUED or waiter.active == active:
            return []
        waiter.expected = expected and not active
        waiter.active = active
        self._tenants[waiter.tenant].active += 1 if active else -1
        return self._drain(now)

    def commit(self, waiter: Waiter) -> None:
        """A response was committed for ``waiter``: from now on it is never shed."""
        waiter.committed = True

    # -- internals --------------------------------------------------------------------------------

    def _any_active(self) -> bool:
        return any(t.active for t in self._tenants.values())

    def fits(self, cost: int) -> bool:
        """A generation of ``cost`` would fit now."""
        if self.max_inflight is not None and self.inflight >= self.max_inflight:
            return False
        return self.max_memory_tokens is None or self.memory + cost <= self.max_memory_tokens

    def _shares(self, extra: str | None = None) -> tuple[float, dict[str, float]]:
        """Total weight of the tenants with work (queued or in flight), and their weights."""
        present = {name: t.weight for name, t in self._tenants.items() if t.inflight or t.queue}
        if extra is not None and extra not in present:
            present[extra] = self._tenants[extra].weight
        return sum(present.values()), present

    def _below_share(self, t: _Tenant, total: float) -> bool:
        share = t.weight / total
        if self.max_inflight is not None and t.inflight >= share * self.max_inflight:
            return False
        return self.max_memory_tokens is None or t.memory < share * self.max_memory_tokens

    def next_waiter(self) -> Waiter | None:
        """The next waiter in the fair order: the lowest tag among the tenants' first active
        waiters, tenants below their share first; where none is active, the expected one with
        the lowest tag (work for a client on its way back beats an idle engine)."""
        best: Waiter | None = None
        best_below: Waiter | None = None
        total = 0.0
        for t in self._tenants.values():
            if t.inflight or t.queue:
                total += t.weight
        for t in self._tenants.values():
            if not t.active:
                continue
            head = next(w for w in t.queue if w.active)
            key = (head.tag, head.seq)
            if best is None or key < (best.tag, best.seq):
                best = head
            if (best_below is None or key < (best_below.tag, best_below.seq)) and (
                self._below_share(t, total)
            ):
                best_below = head
        if best_below or best:
            return best_below or best
        ahead: Waiter | None = None
        for t in self._tenants.values():
            for w in t.queue:
                if w.expected and (ahead is None or (w.tag, w.seq) < (ahead.tag, ahead.seq)):
                    ahead = w
        return ahead

    def _drain(self, now: float) -> list[Waiter]:
        admitted: list[Waiter] = []
        while True:
            head = self.next_waiter()
            if head is None or not self.fits(head.cost):
                return admitted
            t = self._tenants[head.tenant]
            t.inflight += 1  # before it leaves the queue, so the tenant is not pruned
            self._unqueue(head)
            t.memory += head.cost
            self.inflight += 1
            self.memory += head.cost
            self._vtime = max(self._vtime, head.tag)
            head.state = ADMITTED
            head.admitted_at = now
            admitted.append(head)

    def _unqueue(self, waiter: Waiter, *, refund: bool = False) -> None:
        t = self._tenants[waiter.tenant]
        if t.queue and t.queue[-1] is waiter:
            t.queue.pop()
            if refund:  # the tenant's latest request left unserved: its share is given back
                t.finish = waiter.tag
        else:
            t.queue.remove(waiter)
        if waiter.active:
            t.active -= 1
        self.queued -= 1
        self._prune(t)

    def _prune(self, t: _Tenant) -> None:
        # A tenant with nothing queued or in flight is forgotten, so the table holds only
        # tenants with work. It loses no fairness: an idle tenant earns no credit in start-time
        # fair queueing (its next tag is max(V, F) anyway).
        if not t.queue and not t.inflight:
            self._tenants.pop(t.name, None)

    def _victim(self, arriving: Waiter) -> Waiter:
        """Who leaves a full queue: the newest uncommitted waiter (dormant ones first) of the
        tenant furthest over its share of the queue, unless that is no further over than the
        arriving tenant, whose request then is the one refused."""
        total, present = self._shares(arriving.tenant)
        worst: tuple[float, Waiter] | None = None
        for name, weight in present.items():
            t = self._tenants[name]
            excess = len(t.queue) - self.queue_size * weight / total
            candidates = [w for w in t.queue if not w.committed and w is not arriving]
            if not candidates:
                continue
            dormant = [w for w in candidates if not w.active]
            pick = (dormant or candidates)[-1]
            if worst is None or excess > worst[0]:
                worst = (excess, pick)
        own = self._tenants[arriving.tenant]
        own_excess = len(own.queue) - self.queue_size * own.weight / total
        if own_excess > 0 or worst is None or worst[0] <= 0:
            return arriving
        return worst[1]
