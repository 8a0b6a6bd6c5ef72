"""What the relay tells one generation's attempts of the current one, and what each fact means
for its engine (its breaker, the load it holds, its refusal gate) and for the generation's plan
(the history its access line prints): the first token came, the engine took it, it failed, it
was shed, the engine died, the stream was cut, and whether another round may follow. What each
fact means is decided in one pure table (:mod:`~streamsafe.gateway.engines.attempt_end`), so an
end seen twice (by the ask and the relay) counts once; here it is carried out.

The sends are :class:`~streamsafe.gateway.engines.attempts.Attempts`'s, which is these facts'
one implementer: a part of it, kept apart because it is the other half of the conversation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamsafe.gateway.engines.attempt_end import Fact, Told, tell
from streamsafe.gateway.engines.attempt_plan import AttemptPlan, Stop
from streamsafe.gateway.engines.engine_choice import EngineChoice
from streamsafe.gateway.engines.engine_shell import EngineShell
from streamsafe.gateway.engines.engines import Engines
from streamsafe.gateway.engines.refusal_gate import RefusalGate, RefusedCall
from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.upstream.connection import Upstream

__all__ = ["AttemptOutcomes"]


class AttemptOutcomes:
    """The facts the relay tells of the current attempt (see the module)."""

    #: What these facts change (set by :class:`Attempts` as each attempt begins).
    __slots__ = ("_cut_from", "_held", "_told")

    _held: EngineShell | None
    _cut_from: EngineShell | None
    #: What the current attempt's engine was told of it so far (see :mod:`.attempt_end`).
    _told: Told

    if TYPE_CHECKING:  # the rest of the state is Attempts's, declared there
        _engines: Engines
        _gen: Generation
        _cost: int
        _current: EngineShell | None
        choice: EngineChoice
        plan: AttemptPlan
        refused_call: RefusedCall

        def _plan(self, plan: AttemptPlan) -> None: ...

    def release(self) -> None:
        """The generation ended (or moved): its memory no longer weighs on its engine."""
        held, self._held = self._held, None
        if held is not None:
            held.load.memory -= self._cost
            self._engines.room_made()
            if self._told.admitted:  # it ran there: the engine has room for one more
                held.gate.room_made()

    def first_token_came(self) -> None:
        """The first token arrived: the engine works (its breaker closes), and the answer's
        model is set (a continuation stays in it)."""
        engine = self._current
        if engine is not None:
            self.choice.answered_by(engine)
            self._tell(engine, Fact.SERVED)

    def admitted(self) -> None:
        """The engine took the current attempt (a first token; for a plain call, its 200):
        its refusal gate opens, and the generation no longer waits to be refused."""
        if self._current is not None:
            self._tell(self._current, Fact.ADMITTED)

    def answered_whole(self) -> None:
        """The answer ended whole."""
        self.first_token_came()

    def failed(self, why: str, *, shun: bool = False) -> None:
        """The current attempt failed on the engine's side (a 5xx, a reset, a stall, an error
        event standing for a 5xx); ``shun`` where the engine held the request silent past the
        first-token timeout: it is not asked again for this generation."""
        engine = self._current
        if engine is None:
            return
        if shun:
            self.choice.shun(engine)
        self._tell(engine, Fact.FAILED, why)

    def full(self, retry_after: float | None, status: int = 503) -> None:
        """The current engine shed the attempt with ``status`` (429 or 503, as a status or
        in-band): full, not failing, so its breaker is not told; new work goes to other engines
        for the ``Retry-After`` it sent (a second where it sent none), and this generation waits
        at the engine's refusal gate."""
        if self._current is not None:
            self._tell(self._current, Fact.SHED, retry_after=retry_after, status=status)

    def engine_died(self, why: str) -> None:
        """The current engine said it died: held down until its ``/health`` answers."""
        if self._current is not None:
            self._tell(self._current, Fact.DIED, why)

    def cut(self) -> None:
        """The attempt broke and another follows: counted against the engine (where nothing
        else was), and the next attempt goes elsewhere where possible."""
        engine = self._current
        if engine is None:
            return
        self._tell(engine, Fact.CUT, "stream cut")
        self.choice.tried(engine)
        self._cut_from = engine

    def _tell(
        self,
        engine: EngineShell,
        fact: Fact,
        why: str = "",
        *,
        retry_after: float | None = None,
        status: int = 503,
    ) -> None:
        """Carry out what ``fact`` of the current attempt, on ``engine``, means (decided by
        :func:`~streamsafe.gateway.engines.attempt_end.tell`): ``why`` it failed, what a shed
        said (``retry_after``, ``status``)."""
        history = self.plan.history
        acts = tell(self._told, fact, history[-1].outcome if history else None)
        self._told = acts.told
        if acts.outcome is not None:
            self._plan(self.plan.ended(acts.outcome))
        upstream = engine.upstream
        if acts.succeeded:
            upstream.succeeded()
        if acts.failure:
            upstream.failed(why, dead=acts.dead)
        if acts.neutral:
            upstream.abandoned()
        if acts.shed:
            engine.core.said_full(self._engines.clock(), retry_after)
            engine.gate.refused(self.refused_call, status, retry_after)
        if acts.admit:
            engine.gate.admitted(self.refused_call, runs=True)
            gen = self._gen
            if gen.refused:
                gen.refused = False
                gen.wake()

    def again(self, *, shed: bool) -> str | None:
        """The attempt broke, or the engine shed it (``shed``): whether the generation may ask
        again, as its plan says (a wait for room at the engine's gate where shed, else a
        continuation); ``None`` where it may (the plan starts the round), else why not."""
        verdict = self.plan.after_break(shed=shed)
        if isinstance(verdict, Stop):
            return verdict.reason
        self._plan(verdict.plan)
        return None

    def elsewhere(self) -> bool:
        """True where another engine of the model takes traffic now (a refusal made in-band,
        which the ask did not see, is then asked there)."""
        return self.choice.elsewhere(self._current)

    @property
    def engine(self) -> EngineShell:
        """The engine of the latest attempt (before any, the first engine of the model, else
        the first engine)."""
        return self._current if self._current is not None else self.choice.first_engine()

    @property
    def gate(self) -> RefusalGate:
        """The refusal gate of the latest attempt's engine (see :attr:`engine`)."""
        return self.engine.gate

    @property
    def upstream(self) -> Upstream:
        """The connections of the latest attempt's engine (see :attr:`engine`)."""
        return self.engine.upstream
