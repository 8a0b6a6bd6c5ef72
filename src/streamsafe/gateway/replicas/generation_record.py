"""A generation's record in Redis: what another replica needs to mirror it or take it over,
written by the replica that runs it (:func:`record_of`) and read back by the others
(:func:`request_of`, :func:`key_of`). The prompt, the provider data it carries, the caller's
idempotency key and the body's fingerprint are sealed with the replicas' secret where they share
one, and the provider data is left out where they do not (see
:mod:`streamsafe.gateway.replicas.record_seal`).
"""

from __future__ import annotations

import orjson

from streamsafe.gateway.generations.generation import Generation, GenerationRequest
from streamsafe.gateway.replicas.record_seal import SEALED, RecordSeal, Unreadable, Unsealable
from streamsafe.gateway.upstream.kinds import CompletionRoute, Wire

__all__ = ["key_of", "record_of", "request_of"]


def record_of(gen: Generation, seal: RecordSeal | None = None) -> dict[str, bytes | str | int]:
    """What another replica needs to mirror ``gen`` or take it over (``seal``: the replicas'
    shared secret, if any)."""
    req = gen.request
    route = req.route
    body, forward = req.body, req.forward
    key: bytes | str = gen.key or ""
    fingerprint = gen.fingerprint
    if seal is not None:
        body = seal.seal(gen.id, "body", body)
        forward = seal.seal(gen.id, "forward", forward) if forward else b""
        key = seal.seal(gen.id, "key", gen.key.encode()) if gen.key else ""
        fingerprint = seal.seal(gen.id, "fingerprint", fingerprint)
    record: dict[str, bytes | str | int] = {
        "route": b""
        if route is None
        else orjson.dumps(
            [
                route.path,
                route.upstream_path,
                route.wire.value,
                route.upstream_done,
                route.client_done,
                route.preamble,
            ]
        ),
        "tenant": gen.tenant,
        "path": req.path,
        "body": body,
        "fingerprint": fingerprint,
        "cost": gen.cost,
        "stream": "1" if gen.stream else "0",
        "key": key,
        "state": gen.state.value,
    }
    if seal is not None:
        if forward:
            # The client headers it is sent upstream with, sealed: a replica that takes it over
            # sends them.
            record["forward"] = forward
    elif req.forward or req.withheld:
        record["withheld"] = "1"  # it carries provider data, kept out of Redis
    return record


def request_of(
    record: dict[str, bytes], gen_id: str, seal: RecordSeal | None = None
) -> GenerationRequest:
    """The request a record (see :func:`record_of`) holds; its ``body`` must be there. Raises
    :class:`~streamsafe.gateway.replicas.record_seal.Unreadable` for a record it cannot read:
    malformed, or sealed where this replica cannot open it
    (:class:`~streamsafe.gateway.replicas.record_seal.Unsealable`: no secret, or another one)."""
    try:
        return GenerationRequest(
            tenant=record["tenant"].decode(),
            path=record["path"].decode(),
            body=_open(record["body"], gen_id, "body", seal),
            # A fingerprint in clear may begin as a sealed field does: opened only with a
            # secret (without one, a sealed body has already said it cannot be read).
            fingerprint=record["fingerprint"]
            if seal is None
            else _open(record["fingerprint"], gen_id, "fingerprint", seal),
            cost=int(record["cost"]),
            stream=record["stream"] == b"1",
            route=_route(record.get("route", b"")),
            forward=_open(record.get("forward", b""), gen_id, "forward", seal),
            withheld=record.get("withheld") == b"1",
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


def _route(raw: bytes) -> CompletionRoute | None:
    """The route a record names (see :func:`record_of`); ``None`` for vLLM's own."""
    if not raw:
        return None
    path, upstream_path, wire, upstream_done, client_done, preamble = orjson.loads(raw)
    return CompletionRoute(path, upstream_path, Wire(wire), upstream_done, client_done, preamble)
