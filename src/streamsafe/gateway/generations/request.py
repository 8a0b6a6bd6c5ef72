"""What a generation is asked: the request value the registry opens a generation for.

:class:`GenerationRequest` is one incoming request as the registry sees it (tenant, body,
fingerprint, route); :class:`Continuation` is what the latest attempt of a broken stream asks
upstream instead, with its :class:`Rewrite` of the reads; :class:`AskHistory` is what a
generation's record shows of the requests sent upstream for it. Values only: the live object
that carries them is :class:`~streamsafe.gateway.generations.generation.Generation`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from streamsafe.gateway.upstream.kinds import CompletionRoute

__all__ = ["AskHistory", "Continuation", "GenerationRequest", "Rewrite"]


class AskHistory(Protocol):
    """What a generation's record shows of the requests sent upstream for it (the engines'
    :class:`~streamsafe.gateway.engines.attempt_plan.AttemptPlan`, read through this so that
    generations do not import the engines)."""

    @property
    def asks(self) -> int:
        """Requests sent upstream so far."""
        ...

    @property
    def most_asks(self) -> int:
        """The most its bounds allow."""
        ...

    def summary(self) -> str:
        """The kinds of ask after the first, in one short phrase."""
        ...


@dataclass(slots=True)
class GenerationRequest:
    """What the registry needs to know about one incoming request."""

    tenant: str
    path: str
    body: bytes
    fingerprint: bytes
    cost: int
    stream: bool
    idempotency_key: str | None = None
    retry: bool = False
    last_event_id: int | None = None
    no_upstream_retry: bool = False
    #: The route it came on: its wire format and how the upstream ends a stream (every request
    #: has one; keyword-only, as it follows the fields with defaults).
    route: CompletionRoute = field(kw_only=True)
    #: Client headers sent upstream with it, as header lines (Llama Stack's
    #: ``X-LlamaStack-Provider-Data``: a provider's per-request keys); part of the fingerprint.
    forward: bytes = b""
    #: The body has one answer (greedy or seeded: :func:`streamsafe.request_cost.
    #: is_deterministic`), so an identical request may share it (``collapse_identical``).
    deterministic: bool = False
    #: Read from a Redis record that left its ``forward`` out (no ``--redis-secret``): another
    #: replica cannot continue it under the credentials it came with.
    withheld: bool = False
    #: The model the body names ("" where none): the label of the request's metrics. Not
    #: kept in a replica's record (a mirrored generation's requests are labelled by their own).
    model: str = ""


class Rewrite(Protocol):
    """What a continuation does to its stream's reads before they join the answer (see
    docs/design.md, Continuation): reshape a completion by ids into the caller's chat chunks, or
    drop and verify the part of a replayed answer the caller already has."""

    @property
    def diverged(self) -> str | None:
        """Why the stream differs from the answer it continues (it must end with that error)."""

    @property
    def passed(self) -> bool:
        """Every later read passes unchanged: the rewrite may be dropped."""

    def __call__(self, payloads: list[bytes]) -> list[bytes]:
        """The payloads of one read, rewritten (some may be dropped)."""


@dataclass(frozen=True, slots=True)
class Continuation:
    """What the latest attempt of a broken stream asks upstream instead of the request itself
    (see docs/design.md, Continuation): ``body`` to ``path``; ``tokens_before`` delivered before
    it and counted again by neither its prompt nor its usage (its usage is made whole with
    them); ``rewrite``, what its reads go through before they join the answer (a chat answer
    continued on the completion route by token ids, a replayed answer)."""

    path: str
    body: bytes
    tokens_before: int
    rewrite: Rewrite | None = None
