"""Where one generation's asks go: the engines it may still ask, and the pick for each ask (see
docs/design.md, Engine pool and Failover).

A generation asks the model its body names, or, before its first token, a fallback the pool
picks or the larger model its plan moves it to. Once an engine sent the first token the
answer's model is set: a continuation stays in it, never on another model. Within a round an
engine it already tried is not picked again while another is left; an engine that held it
silent past the first-token timeout (shunned) is never asked again by it. The I/O shell that
sends the asks is :class:`~streamsafe.gateway.engines.attempts.Attempts`.
"""

from __future__ import annotations

from streamsafe.gateway.engines.answers import Refused, unavailable
from streamsafe.gateway.engines.engine_shell import EngineShell
from streamsafe.gateway.engines.engines import Engines
from streamsafe.gateway.engines.pool import Full, Pick, Unavailable

__all__ = ["EngineChoice"]


class EngineChoice:
    """The engines one generation of ``model`` holding ``cost`` tokens may ask (see the
    module)."""

    __slots__ = (
        "_cost",
        "_engines",
        "_shunned",
        "_tried",
        "answering_model",
        "asking",
        "model",
        "picked",
    )

    def __init__(self, engines: Engines, model: str, cost: int) -> None:
        self._engines = engines
        #: The model the request body names (a fallback may answer instead).
        self.model = model
        #: The model whose engine sent the first token: a continuation stays in it.
        self.answering_model: str | None = None
        self._cost = cost
        self._tried: set[int] = set()
        self._shunned: set[int] = set()
        #: The model the current round asks (the larger one after a larger-model verdict).
        self.asking = model
        #: The engine picked for the current round's asks (kept for a same-engine or a connect
        #: retry); ``None`` until one is picked.
        self.picked: Pick | None = None

    def start_round(self) -> None:
        """A round begins: it asks the answer's model where one began, on an engine picked
        afresh."""
        self.asking = self.answering_model or self.model
        self.picked = None

    def tried(self, engine: EngineShell) -> None:
        """``engine`` failed this generation (before its first token, or cut): another is picked
        while one is left."""
        self._tried.add(engine.core.index)
        self.picked = None

    def shun(self, engine: EngineShell) -> None:
        """``engine`` held this generation silent past the first-token timeout: never again."""
        self._shunned.add(engine.core.index)

    def larger_model(self) -> None:
        """The plan moves this round to the model's larger fallback."""
        self.asking = self._engines.pool.fallbacks[self.asking]
        self.picked = None

    def may_grow(self) -> bool:
        """Whether this round may move to a larger model (none answered yet, and one exists)."""
        return self.answering_model is None and self.asking in self._engines.pool.fallbacks

    def answered_by(self, engine: EngineShell) -> None:
        """``engine`` sent the first token: the answer's model is its (see the module)."""
        if self.answering_model is None:
            self.answering_model = self._engines.pool.answering(self.model, engine.core)

    def keep_pick(self) -> bool:
        """Whether the round's pick is asked again (a same-engine retry): where its breaker
        still allows it; else it is dropped and another is picked."""
        if self.picked is None:
            return True
        if self._engines.of(self.picked.engine).breaker.allows(self._engines.clock()):
            return True
        self.picked = None
        return False

    async def choose(self, since: float, *, first: bool) -> EngineShell | Refused | Unavailable:
        """The engine of this ask: the round's pick where it has one, else a pick, after
        waiting for room where every engine of the model is full (the refusal to pass on where
        that wait gave up; ``since``: when the generation began waiting); :class:`Unavailable`
        where no engine is left. ``first``: no attempt of this round was made yet."""
        engines = self._engines
        while self.picked is None:  # waits for room; sends nothing
            pick = self._pick(first)
            if isinstance(pick, Unavailable):
                return pick
            if isinstance(pick, Full):
                full = await engines.wait_for_room(self.asking, self._cost, since)
                if full is not None:
                    return full
                continue
            self.picked = pick
        return engines.of(self.picked.engine)

    def _pick(self, first: bool) -> Pick | Full | Unavailable:
        """An engine not tried yet by this generation where there is one, else (before any
        attempt of the round) one it was cut on; never one it shunned. Before the first token
        the pool may pick a fallback model."""
        engines = self._engines
        now = engines.clock()
        fallback = self.answering_model is None
        exclude = self._tried | self._shunned
        pick = engines.pool.pick(self.asking, now, exclude, self._cost, fallback=fallback)
        if isinstance(pick, Unavailable) and self._tried and first:
            # Only engines it was cut on are left (a pool of one): use them.
            pick = engines.pool.pick(self.asking, now, self._shunned, self._cost, fallback=fallback)
        return pick

    def unavailable(self, pick: Unavailable) -> Refused:
        """The answer where no engine of the round's model is left (``pick`` says why)."""
        silent = any(
            e.index in self._shunned and not e.breaker.held
            for e in self._engines.pool.serving(self.asking)
        )
        return unavailable(self.asking, pick, silent)

    def stranded(self) -> str | None:
        """Why no engine can take the next attempt of this generation, where none can (see
        :meth:`~streamsafe.gateway.engines.pool.Pool.stranded`): of the answer's model once it
        began, else of the model asked for or its fallbacks."""
        pool = self._engines.pool
        models = [self.answering_model] if self.answering_model else pool.chain(self.model)
        return pool.stranded(models, self._shunned)

    def elsewhere(self, current: EngineShell | None) -> bool:
        """True where an engine of the model other than ``current`` takes traffic now."""
        model = self.answering_model or self.model
        core = current.core if current is not None else None
        return self._engines.pool.others_take_traffic(model, core, self._engines.clock())

    def first_engine(self) -> EngineShell:
        """The first engine of the model (the first engine where none serves it)."""
        serving = self._engines.serving(self.model)
        return serving[0] if serving else self._engines.first
