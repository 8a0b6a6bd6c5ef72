"""A generation's record in Redis: what another replica needs to mirror it or take it over,
written by the replica that runs it (:func:`record_of`) and read back by the others
(:func:`request_of`, :func:`key_of`).

The record holds the generation's request whole: every field of
:class:`~streamsafe.gateway.generations.request.GenerationRequest` by its name (its route's
too), so a replica that takes it over rebuilds the very request, and a field added to the
request reaches the record with no second list to keep (the round trip is property-tested). Its
secret fields (the prompt, the provider data it carries, the caller's idempotency key, the
body's fingerprint) and the generation's key are each their own field of the record, sealed with
the replicas' secret where they share one; the provider data is left out where they do not
(see :mod:`streamsafe.gateway.replicas.record_seal`). The generation's state is a field of its
own too: the replicas' scripts change it in place.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.replicas.record_seal import SEALED, RecordSeal, Unreadable, Unsealable
from streamsafe.gateway.upstream.kinds import CompletionRoute, Wire

__all__ = ["key_of", "record_of", "request_of"]


#: The request's fields kept out of its clear part: each its own field of the record, sealed
#: where the replicas share a secret (``forward`` only then: left out without one).
_SECRET = ("body", "fingerprint", "forward", "idempotency_key")


def record_of(gen: Generation, seal: RecordSeal | None = None) -> dict[str, bytes | str | int]:
    """What another replica needs to mirror ``gen`` or take it over (``seal``: the replicas'
    shared secret, if any)."""
    req = gen.request
    withheld = req.withheld or (seal is None and bool(req.forward))
    clear = {f.name: getattr(req, f.name) for f in dataclasses.fields(req) if f.name not in _SECRET}
    clear["route"] = _route_fields(req.route)
    clear["withheld"] = withheld
    record: dict[str, bytes | str | int] = {
        "request": orjson.dumps(clear),
        "state": gen.state.value,
    }
    secrets = {
        "body": req.body,
        "fingerprint": gen.fingerprint,
        "forward": req.forward if seal is not None else b"",  # provider data: sealed or absent
        "idempotency_key": (req.idempotency_key or "").encode(),
        "key": (gen.key or "").encode(),
    }
    for name, value in secrets.items():
        # The body is always there (empty once a kept generation let its prompt go): a
        # record without it is one whose owner has not finished writing it (see mirrors.py).
        if value or name == "body":
            record[name] = value if seal is None else seal.seal(gen.id, name, value)
    return record


def request_of(
    record: dict[str, bytes], gen_id: str, seal: RecordSeal | None = None
) -> GenerationRequest:
    """The request a record (see :func:`record_of`) holds. Raises
    :class:`~streamsafe.gateway.replicas.record_seal.Unreadable` for a record it cannot read:
    malformed, or sealed where this replica cannot open it
    (:class:`~streamsafe.gateway.replicas.record_seal.Unsealable`: no secret, or another one)."""
    try:
        clear: dict[str, Any] = orjson.loads(record["request"])
        route = clear.pop("route")
        # The body is there or the record says nothing; a fingerprint in clear may begin as a
        # sealed field does: opened only with a secret (without one, a sealed body has
        # already said it cannot be read).
        body = _open(record["body"], gen_id, "body", seal)
        fingerprint = record.get("fingerprint", b"")
        key = _open(record.get("idempotency_key", b""), gen_id, "idempotency_key", seal)
        return GenerationRequest(
            **clear,
            body=body,
            fingerprint=fingerprint
            if seal is None
            else _open(fingerprint, gen_id, "fingerprint", seal),
            forward=_open(record.get("forward", b""), gen_id, "forward", seal),
            idempotency_key=key.decode() or None,
            route=_route(route),  # a record with none is malformed: Unreadable
        )
    except Unreadable:
        raise
    except (KeyError, ValueError, TypeError) as exc:  # UnicodeDecodeError, JSONDecodeError too
        raise Unreadable(f"{gen_id}: its Redis record is malformed ({exc!r})") from None


def key_of(record: dict[str, bytes], gen_id: str, seal: RecordSeal | None = None) -> str | None:
    """The key a record (see :func:`record_of`) names its generation by, if any. Raises
    :class:`~streamsafe.gateway.replicas.record_seal.Unreadable` as :func:`request_of` does."""
    try:
        return _open(record.get("key", b""), gen_id, "key", seal).decode() or None
    except UnicodeDecodeError as exc:
        raise Unreadable(f"{gen_id}: its Redis record is malformed ({exc!r})") from None


def _open(value: bytes, gen_id: str, field: str, seal: RecordSeal | None) -> bytes:
    if not value.startswith(SEALED):
        return value
    if seal is None:
        raise Unsealable(f"{gen_id}: the record's {field} is sealed, and no Redis secret is set")
    return seal.open(gen_id, field, value)


def _route_fields(route: CompletionRoute) -> dict[str, Any]:
    fields = {f.name: getattr(route, f.name) for f in dataclasses.fields(route)}
    fields["wire"] = route.wire.value
    return fields


def _route(fields: dict[str, Any]) -> CompletionRoute:
    """The route a record names, from its fields (see :func:`record_of`)."""
    return CompletionRoute(**{**fields, "wire": Wire(fields["wire"])})
