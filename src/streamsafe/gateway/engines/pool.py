"""The engine pool: which engine serves an attempt.

Sans-I/O, like :mod:`streamsafe.gateway.admission.fair_queue`: every decision takes the clock
reading as an argument and nothing here sleeps, connects or logs.

- **Routing**: an engine serves the models it lists (none listed: any model). Among the engines
  of a model whose breaker lets traffic through, the least loaded wins: estimated memory in
  flight per unit of weight, then queued requests per unit of weight, then the one picked least
  recently (so equal engines take turns).
- **Breaker** per engine (:class:`~streamsafe.gateway.upstream.breaker.EngineBreaker`): an engine
whose
  breaker is open takes no attempt; a half-open one takes one probe at a time.
- **Fallback models**: when no engine of a model can take traffic, the model's configured
  fallback (and its fallback, without cycles) is tried; the pick names the model that will answer.

What to do when an attempt fails is :mod:`streamsafe.gateway.engines.failover`; the I/O shell around
the pool is :mod:`streamsafe.gateway.engines.engines`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from streamsafe._url_userinfo import split_userinfo
from streamsafe.gateway.upstream.breaker import EngineBreaker

__all__ = [
    "MAX_FULL_FOR",
    "Counts",
    "Engine",
    "EngineLoad",
    "EngineSpec",
    "Full",
    "Pick",
    "Pool",
    "Unavailable",
    "parse_engine",
    "parse_fallback",
]

#: Longest an engine that shed a request is passed over for new work (its ``Retry-After``,
#: bounded: a full engine frees room as its answers end).
MAX_FULL_FOR = 10.0

# -- configuration ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class EngineSpec:
    """One engine behind the gateway.

    Written on the command line as ``URL [models=a,b] [weight=W] [memory=TOKENS]``, e.g.
    ``--upstream "http://10.0.0.5:8000 models=llama-8b weight=2 memory=30000"``.
    """

    #: Base URL of the OpenAI-compatible engine.
    url: str
    #: Models it serves; empty (default) means any model, for a pool of identical engines.
    models: frozenset[str] = frozenset()
    #: Share of traffic relative to the others (default 1): an engine with twice the GPUs gets
    #: weight 2 and is picked until it holds twice the load.
    weight: float = 1.0
    #: Engine memory in tokens that generations sent to it may hold at once (prompt +
    #: max_tokens each; vLLM logs its KV capacity as "GPU KV cache size"). ``None`` (default):
    #: no bound of its own; a generation that fits no engine of its model waits for room.
    memory: int | None = None
    #: ``user:password`` of a URL that carried them (``http://user:password@host``), sent as
    #: Basic authorization and nowhere else: :attr:`url`, the engine's name in every log line,
    #: ``/stats`` and ``/metrics``, is kept without them.
    userinfo: str | None = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        url, userinfo = split_userinfo(self.url)
        if userinfo is not None:
            object.__setattr__(self, "url", url)
            object.__setattr__(self, "userinfo", userinfo)
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"engine URL must be http(s)://..., not {self.url!r}")
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise ValueError(f"engine weight must be a positive number, not {self.weight!r}")
        if self.memory is not None and self.memory < 1:
            raise ValueError(f"engine memory must be >= 1 token, not {self.memory!r}")

    def serves(self, model: str) -> bool:
        """True if this engine serves ``model``."""
        return not self.models or model in self.models

    def __str__(self) -> str:
        parts = [self.url]
        if self.models:
            parts.append("models=" + ",".join(sorted(self.models)))
        if self.weight != 1.0:
            parts.append(f"weight={self.weight:g}")
        if self.memory is not None:
            parts.append(f"memory={self.memory}")
        return " ".join(parts)


def parse_engine(text: str) -> EngineSpec:
    """An :class:`EngineSpec` from ``URL [models=a,b] [weight=W]`` (the ``--upstream`` value)."""
    if not text.split():
        raise ValueError("an engine is URL [models=a,b] [weight=W] [memory=TOKENS], not blank")
    url, *options = text.split()
    models: frozenset[str] = frozenset()
    weight = 1.0
    memory: int | None = None
    for option in options:
        name, sep, value = option.partition("=")
        if not sep or not value:
            raise ValueError(f"engine option {option!r} is not name=value")
        if name == "models":
            models = frozenset(m for m in value.split(",") if m)
        elif name == "weight":
            try:
                weight = float(value)
            except ValueError:
                raise ValueError(f"engine weight {value!r} is not a number") from None
        elif name == "memory":
            try:
                memory = int(value)
            except ValueError:
                raise ValueError(f"engine memory {value!r} is not a number of tokens") from None
        else:
            raise ValueError(f"unknown engine option {name!r} (models=, weight=, memory=)")
    return EngineSpec(url.rstrip("/"), models, weight, memory)


def parse_fallback(text: str) -> tuple[str, str]:
    """``A=B`` (the ``--fallback-model`` value): when model A cannot answer, model B does."""
    model, sep, fallback = text.partition("=")
    model, fallback = model.strip(), fallback.strip()
    if not sep or not model or not fallback or model == fallback:
        raise ValueError(f"fallback must be MODEL=OTHER_MODEL, not {text!r}")
    return model, fallback


# -- load and picking ---------------------------------------------------------------------------


class EngineLoad(Protocol):
    """What the pool reads of an engine's load (an engine's admission provides it)."""

    @property
    def memory(self) -> int:
        """Estimated engine memory held by admitted generations, in tokens."""
        ...

    @property
    def queued(self) -> int:
        """Requests waiting for this engine."""
        ...


@dataclasses.dataclass(slots=True)
class Counts:
    """A plain :class:`EngineLoad` (for a pool whose engines have no admission of their own)."""

    memory: int = 0
    queued: int = 0


@dataclasses.dataclass(slots=True)
class Engine:
    """One engine of the pool: its spec, its load and its breaker."""

    index: int
    spec: EngineSpec
    load: EngineLoad
    breaker: EngineBreaker
    #: Pick counter at its last pick: equal engines take turns.
    last_pick: int = -1
    #: Until when the engine said it is full (it shed a request: a 429 or 503, for its
    #: ``Retry-After``): picked only where no other engine has room. Full is not failing: its
    #: breaker stays closed.
    full_until: float = 0.0
    #: The engine's KV capacity in tokens, learned from it where ``spec.memory`` is not given
    #: (vLLM's ``/metrics``; see upstream/capacity.py). ``None``: not known.
    learned_memory: int | None = None

    @property
    def memory(self) -> int | None:
        """Tokens generations sent to it may hold at once: the operator's ``memory=``, else
        what the engine said it holds; ``None`` for no bound."""
        return self.spec.memory if self.spec.memory is not None else self.learned_memory

    def said_full(self, now: float, retry_after: float | None) -> None:
        """It shed a request: passed over for new work for ``retry_after`` seconds (a second
        where it said none, at most :data:`MAX_FULL_FOR`)."""
        self.full_until = now + min(MAX_FULL_FOR, 1.0 if retry_after is None else retry_after)

    def could_hold(self, cost: int) -> bool:
        """True if a generation of ``cost`` tokens fits the engine's memory when it is empty."""
        cap = self.memory
        return cap is None or cost <= cap

    def has_room(self, cost: int) -> bool:
        """True if a generation of ``cost`` tokens fits the engine's memory now."""
        cap = self.memory
        return cap is None or self.load.memory + cost <= cap

    def score(self, now: float) -> tuple[bool, float, float, int]:
        """Lower is picked first: not said full lately, then memory per weight, then queue per
        weight, then turn."""
        weight = self.spec.weight
        load = self.load
        return (now < self.full_until, load.memory / weight, load.queued / weight, self.last_pick)


@dataclasses.dataclass(frozen=True, slots=True)
class Pick:
    """An engine for an attempt, and the model it is asked for."""

    engine: Engine
    #: The model that will answer: the requested one, or a fallback where none of its engines
    #: could take the attempt (the response then names this model).
    model: str
    #: The model the request asked for.
    asked: str

    @property
    def fallback(self) -> bool:
        """True where a fallback model answers instead of the one asked for."""
        return self.model != self.asked


@dataclasses.dataclass(frozen=True, slots=True)
class Full:
    """Engines of the model take traffic but none has room for the generation now: wait for
    one to free memory (admission per engine)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Unavailable:
    """No engine can take the model (or its fallbacks) now: answer 503 with ``Retry-After``;
    ``known`` is False where no engine serves the model at all (404)."""

    retry_after: float
    known: bool = True


class Pool:
    """The engines behind one gateway (see the module).

    ``loads`` gives each engine's :class:`EngineLoad` and ``breakers`` each engine's breaker,
    one per spec, in order (the gateway passes the load counts its generations add to and the
    breakers its engines' health probes hold); ``fallbacks`` maps a model to the model that
    answers when none of its engines can.
    """

    def __init__(
        self,
        specs: Sequence[EngineSpec],
        loads: Sequence[EngineLoad],
        breakers: Sequence[EngineBreaker],
        *,
        fallbacks: Mapping[str, str] | None = None,
    ) -> None:
        if not specs:
            raise ValueError("a pool needs at least one engine")
        if len(loads) != len(specs):
            raise ValueError("one load per engine")
        if len(breakers) != len(specs):
            raise ValueError("one breaker per engine")
        self.engines = [
            Engine(i, spec, load, breaker)
            for i, (spec, load, breaker) in enumerate(zip(specs, loads, breakers, strict=True))
        ]
        self.fallbacks = dict(fallbacks or {})
        self._picks = 0

    def serving(self, model: str) -> list[Engine]:
        """Engines that serve ``model`` (whatever their breakers say)."""
        return [e for e in self.engines if e.spec.serves(model)]

    def pick(
        self,
        model: str,
        now: float,
        exclude: Collection[int] = (),
        cost: int = 0,
        *,
        fallback: bool = True,
    ) -> Pick | Full | Unavailable:
        """The engine for the next attempt of a request for ``model`` that holds ``cost``
        tokens; ``exclude`` holds the indexes of engines this request already failed on. Marks
        the pick as a probe where the engine's breaker is half-open. :class:`Full` where engines
        of the model are up but none has room (a full model waits; it does not fall back).
        ``fallback=False`` keeps to ``model`` itself (a continuation goes on in the model that
        began the answer)."""
        chain = self.chain(model) if fallback else [model]
        known = any(self.serving(m) for m in chain)
        wait = math.inf
        too_large = False
        # First the engines whose breakers let traffic through, along the fallback chain; then,
        # where none does, "panic" (as Envoy calls it): every candidate is cooling down after
        # failures, and turning all traffic away would fail every caller for the breakers'
        # sake, so those not known down take it (EngineBreaker.down).
        for panic in (False, True):
            for current in chain:
                candidates = [e for e in self.serving(current) if e.index not in exclude]
                if panic:
                    usable = [e for e in candidates if not e.breaker.down(now)]
                else:
                    usable = [e for e in candidates if e.breaker.allows(now)]
                    for e in candidates:
                        wait = min(wait, e.breaker.retry_after(now))
                if usable:
                    holding = [e for e in usable if e.could_hold(cost)]
                    if not holding:
                        # Larger than any of this model's engines holds (a context or a KV cache
                        # too small): its fallback may hold it, as for vLLM's context 400.
                        too_large = True
                        continue
                    roomy = [e for e in holding if e.has_room(cost)]
                    if not roomy:
                        return Full()
                    best = min(roomy, key=lambda e: e.score(now))
                    best.breaker.on_attempt(now)
                    best.last_pick = self._picks
                    self._picks += 1
                    return Pick(best, current, model)
        if too_large:
            return Full()  # the caller finds it can never fit (Engines.can_ever_fit): 400
        if math.isinf(wait):
            wait = min((e.breaker.retry_after(now) for e in self.engines), default=1.0)
        return Unavailable(max(wait, 0.0), known)

    def chain(self, model: str) -> list[str]:
        """``model``, then its fallback, and so on (a cycle ends the chain)."""
        chain: list[str] = []
        current: str | None = model
        while current is not None and current not in chain:
            chain.append(current)
            current = self.fallbacks.get(current)
        return chain

    def stranded(self, models: Sequence[str], shunned: Collection[int]) -> str | None:
        """Why no engine of ``models`` can take an attempt, where none can: each is held down by
        its health probe or in ``shunned`` (silent past the first-token timeout for this
        generation). ``None`` where one may (a breaker only cooling down is waited for)."""
        candidates = [e for e in self.engines if any(e.spec.serves(m) for m in models)]
        if not candidates or any(not e.breaker.held and e.index not in shunned for e in candidates):
            return None
        down = [e.spec.url for e in candidates if e.breaker.held]
        silent = [e.spec.url for e in candidates if not e.breaker.held]
        parts = []
        if down:
            parts.append(f"engine {', '.join(down)} down (its /health does not answer)")
        if silent:
            parts.append(f"engine {', '.join(silent)} silent past the first-token timeout")
        which = f"of {models[0]!r} " if models[0] else ""
        return f"no engine {which}can go on: " + "; ".join(parts)

    def others_take_traffic(self, model: str, current: Engine | None, now: float) -> bool:
        """True where an engine of ``model`` other than ``current`` takes traffic now."""
        return any(e is not current and e.breaker.takes_traffic(now) for e in self.serving(model))

    def answering(self, model: str, engine: Engine) -> str:
        """The model ``engine`` answers a request for ``model`` as: the first of ``model`` and
        its fallbacks that it serves."""
        return next((m for m in self.chain(model) if engine.spec.serves(m)), model)

    def models(self) -> list[str]:
        """Models some engine lists (engines that serve any model add nothing)."""
        return sorted({m for e in self.engines for m in e.spec.models})
