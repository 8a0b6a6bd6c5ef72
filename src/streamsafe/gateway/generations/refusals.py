"""What the engine refused, kept so the same request is answered without asking the engine again.

Behind a Llama Stack server (client -> OGX -> gateway -> engine) the server's own client (the
openai SDK: 2 retries on 429 and 503, ``x-stainless-retry-count`` 1 and 2) retries every
refusal it gets, and its caller retries on top, each retry of the caller arriving as a fresh
call with the same body (docs/design.md, Positions around Llama Stack). A call the gateway
refused (with ``engine_refusals="wait"`` after waiting its round at the engine's gate, see
:mod:`streamsafe.gateway.engines.refusal_gate`; with ``"answer"`` at once) is noted here by
``(tenant, body fingerprint)``; while the engine refuses (nothing it was asked completed since,
for at most :data:`REFUSAL_MEMORY_S` seconds) a request with the same body, marked as a retry or
not, or under the same ``Idempotency-Key``, gets the same answer from here, and costs the engine
nothing. A request with another body still asks (or waits at the gate), and the first answer
the engine completes ends the memory.

Pure and in-process: a dict and a clock reading, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamsafe.gateway.errors import Failure

__all__ = ["REFUSAL_MEMORY_S", "EngineRefusals", "EngineRefused"]

#: The longest a refusal answers retries: a few of the openai SDK's backoffs (0.5-8 s, or the
#: engine's Retry-After), after which a retry asks the engine itself.
REFUSAL_MEMORY_S = 10.0


class EngineRefused(Exception):
    """A retry of a request the engine refused while it still refuses: answer ``failure``."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.status)
        self.failure = failure


@dataclass
class _Refusal:
    failure: Failure
    at: float


class EngineRefusals:
    """The engine's refusals of the last :data:`REFUSAL_MEMORY_S` seconds, by ``(tenant, body
    fingerprint)``, forgotten all at once when the engine completes an answer."""

    def __init__(self, memory: float = REFUSAL_MEMORY_S) -> None:
        self.memory = memory
        self._refused: dict[tuple[str, bytes], _Refusal] = {}
        #: Retries answered from here (``refusals_answered`` in ``/stats``).
        self.answered = 0

    def note(self, tenant: str, fingerprint: bytes, failure: Failure, now: float) -> None:
        """The engine refused this request (``failure`` is what its caller got) at ``now``."""
        self._drop_older(now)
        self._refused[(tenant, fingerprint)] = _Refusal(failure, now)

    def served(self) -> None:
        """The engine completed an answer: it has room again, so nothing here holds."""
        self._refused.clear()

    def answer(self, tenant: str, fingerprint: bytes, now: float) -> Failure | None:
        """The refusal a retry of this request gets at ``now`` without asking the engine, or
        ``None`` where it should ask (never refused, or too long ago, or served since)."""
        found = self._refused.get((tenant, fingerprint))
        if found is None or now - found.at > self.memory:
            return None
        self.answered += 1
        return found.failure

    def _drop_older(self, now: float) -> None:
        # Bounded by what one memory window refuses; swept on each note, no timer.
        stale = [k for k, r in self._refused.items() if now - r.at > self.memory]
        for key in stale:
            del self._refused[key]
