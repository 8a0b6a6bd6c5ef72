"""The routes the gateway answers itself from its engines: ``/ready`` (whether some engine can
take work now) and the model list (the pool's, or a live engine's for an upstream with no
pass-through, in a shape both OpenAI's and Llama Stack's clients read)."""

from __future__ import annotations

import orjson

from streamsafe.gateway.engines.engines import Engines
from streamsafe.gateway.errors import BadRequest, error_body
from streamsafe.gateway.upstream.connect_failure import connect_failure
from streamsafe.gateway.upstream.errors import ConnectFailed, UpstreamError
from streamsafe.server.asgi import Send, respond

__all__ = ["answer_models", "answer_ready"]


async def answer_ready(
    send: Send, engines: Engines, draining: bool, fleet_trouble: str | None = None
) -> None:
    """Readiness: 200 only while the gateway takes work and some engine can do it: not
    ``draining``, no ``fleet_trouble`` (a replica that cannot read the others' records, or whose
    Redis lost the fleet's state moments ago), and some engine not held down whose health route
    answered within the last probe interval or answers now. (``/health`` is liveness: 200 while
    the process serves at all, so a supervisor never restarts a gateway, and throws away its
    replay logs, for an engine's outage.)"""
    if draining or fleet_trouble is not None:
        why = "the gateway is draining" if draining else fleet_trouble
        body = error_body(why or "", "service_unavailable", 503)
        await respond(send, 503, body, headers=[(b"retry-after", b"1")])
        return
    if await engines.ready():
        await respond(send, 200, b'{"status":"ok"}')
        return
    down = ", ".join(e.upstream.base_url for e in engines.shells)
    body = error_body(f"no engine answers its health check ({down})", "service_unavailable", 503)
    ra = str(engines.retry_after()).encode()
    await respond(send, 503, body, headers=[(b"retry-after", ra)])


async def answer_models(send: Send, engines: Engines) -> None:
    """The model list: the pool's models, wherever they are served, where the engine specs
    name them; else a live engine's own list (see :meth:`Engines.live`; 503 where it is
    unreachable)."""
    listed = engines.pool.models()
    if listed:
        data = [{"id": m, "object": "model", "owned_by": "streamsafe"} for m in listed]
        body = orjson.dumps({"object": "list", "data": data})
        await respond(send, 200, _both_model_lists(body))
        return
    try:
        response = await engines.live().upstream.open("GET", "/v1/models")
        try:
            body = await response.read_body()
        finally:
            response.release()
    except UpstreamError as exc:
        why = connect_failure(exc) if isinstance(exc, ConnectFailed) else None
        msg = f"upstream unreachable: {why or type(exc).__name__}"
        raise BadRequest(503, msg) from None
    if response.status == 200:
        body = _both_model_lists(body)
    await respond(send, response.status, body)


def _both_model_lists(body: bytes) -> bytes:
    """An OpenAI model list that Llama Stack's clients read too: each model also carries the
    fields of Llama Stack's own (``identifier``, ``provider_resource_id``, ``provider_id``,
    ``model_type``, ``type``, ``metadata``), as llama-stack-client 0.2 lists models from the
    same ``/v1/models`` (it read every identifier as ``None``). A body that is no such list is
    left as it came."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return body
    for model in data:
        if isinstance(model, dict) and isinstance(model.get("id"), str):
            model.setdefault("identifier", model["id"])
            model.setdefault("provider_resource_id", model["id"])
            model.setdefault("provider_id", str(model.get("owned_by") or "streamsafe"))
            model.setdefault("model_type", "llm")
            model.setdefault("type", "model")
            model.setdefault("metadata", {})
    return orjson.dumps(doc)
