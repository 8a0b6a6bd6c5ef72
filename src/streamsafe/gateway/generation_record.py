"""A generation's record in Redis: what another replica needs to mirror it or take it over,
written by the replica that runs it (:func:`record_of`) and read back by the others
(:func:`request_of`).
"""

from __future__ import annotations

import orjson

from streamsafe.gateway.generation import Generation, GenerationRequest
from streamsafe.gateway.upstream_kinds import CompletionRoute, Wire

__all__ = ["record_of", "request_of"]


def record_of(gen: Generation) -> dict[str, bytes | str | int]:
    """What another replica needs to mirror ``gen`` or take it over."""
    req = gen.request
    route = req.route
    return {
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
        "body": req.body,
        "fingerprint": gen.fingerprint,
        "cost": gen.cost,
        "stream": "1" if gen.stream else "0",
        "key": gen.key or "",
        "state": gen.state.value,
        # The client headers it is sent upstream with: a replica that takes it over sends them.
        "forward": req.forward,
    }


def request_of(record: dict[str, bytes]) -> GenerationRequest:
    """The request a record (see :func:`record_of`) holds; its ``body`` must be there."""
    return GenerationRequest(
        tenant=record["tenant"].decode(),
        path=record["path"].decode(),
        body=record["body"],
        fingerprint=record["fingerprint"],
        cost=int(record["cost"]),
        stream=record["stream"] == b"1",
        route=_route(record.get("route", b"")),
        forward=record.get("forward", b""),
    )


def _route(raw: bytes) -> CompletionRoute | None:
    """The route a record names (see :func:`record_of`); ``None`` for vLLM's own."""
    if not raw:
        return None
    path, upstream_path, wire, upstream_done, client_done, preamble = orjson.loads(raw)
    return CompletionRoute(path, upstream_path, Wire(wire), upstream_done, client_done, preamble)
