"""Telling kinds of upstream apart: a few ``GET`` requests (no work is ever started), what they
answered, and the kind that settles (:func:`probe_kind`, the one network call; the rest is pure).

Llama Stack answers ``/v1/health`` with ``{"status": "OK"}`` in every release, and which
completion routes it serves tells its releases apart; vLLM answers ``/health``; anything else that
lists models at ``/v1/models`` is taken for a generic OpenAI-compatible server (see
:mod:`streamsafe.gateway.upstream.kinds` for what the gateway does with each).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import orjson

from streamsafe.gateway.upstream.connect_failure import connect_failure
from streamsafe.gateway.upstream.errors import ConnectFailed, UpstreamError
from streamsafe.gateway.upstream.transport import ConnectionPool

__all__ = [
    "KIND_NAMES",
    "PROBE_PATHS",
    "KindName",
    "ProbeResult",
    "describe_probes",
    "detect_kind",
    "next_probe",
    "probe_kind",
]

#: The name of a kind of upstream (:data:`streamsafe.gateway.upstream.kinds.KINDS` by name).
KindName = Literal["vllm", "ogx", "llama-stack", "openai"]

#: Every kind ``--upstream-kind`` accepts besides ``auto``, in the order :func:`detect_kind`
#: tells them apart: ``ogx`` is today's Llama Stack (OGX 1.x, llama-stack >= 0.4), ``llama-stack``
#: its 0.2 releases (the native routes).
KIND_NAMES: tuple[KindName, ...] = ("ogx", "llama-stack", "vllm", "openai")


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What one ``GET`` of the probe saw: the status (``None``: no answer, and ``reason`` says
    why, e.g. a certificate that did not verify) and the body's start."""

    status: int | None
    body: bytes = b""
    reason: str = ""

    @property
    def route_exists(self) -> bool:
        """The path is served (by some method): it answered, and not 404."""
        return self.status is not None and self.status != 404


#: Bytes of each probe's answer kept (enough for a model list's first names).
_PROBE_BODY = 4096

#: Every path :func:`probe_kind` may ask, each with a ``GET`` (no work is ever started):
#: :func:`next_probe` says which, in order.
PROBE_PATHS = (
    "/v1/health",
    "/v1/version",
    "/v1/chat/completions",
    "/v1/inference/chat-completion",
    "/health",
    "/v1/models",
)


def _llama_stack_health(probes: Mapping[str, ProbeResult]) -> bool:
    """Whether ``/v1/health`` answered as every Llama Stack does: 200 ``{"status": "OK"}``."""
    health = probes.get("/v1/health")
    if health is None or health.status != 200:
        return False
    try:
        doc = orjson.loads(health.body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(doc, dict) and str(doc.get("status", "")).upper() == "OK"


def detect_kind(probes: Mapping[str, ProbeResult]) -> KindName | None:
    """The kind of upstream that answered ``probes`` (path -> result of a ``GET``), or ``None``
    while what was asked does not settle it (or where nothing answered as any kind does).

    Llama Stack answers ``/v1/health`` with ``{"status": "OK"}`` (vLLM has no such path), in
    every release; which routes it serves tells the releases apart, so a kind is settled only on
    a route it protects: ``/v1/chat/completions`` served (a ``GET`` lists stored completions)
    is today's (``ogx``: OGX, llama-stack >= 0.4); the native ``/v1/inference/chat-completion``
    served (a ``GET`` gets 405) is 0.2 (``llama-stack``); neither settles nothing. vLLM answers
    ``/health`` with 200, or 503 once its engine died. Anything else that lists models at
    ``/v1/models`` (200, or 401/403 without a key) is taken for a generic OpenAI-compatible
    server.
    """
    if _llama_stack_health(probes):
        today = probes.get("/v1/chat/completions")
        if today is not None and today.route_exists:
            return "ogx"
        native = probes.get("/v1/inference/chat-completion")
        if native is not None and native.route_exists:
            return "llama-stack"
        return None
    health = probes.get("/health")
    if health is not None and health.status in (200, 503):
        return "vllm"
    models = probes.get("/v1/models")
    if models is not None and models.status in (200, 401, 403):
        return "openai"
    return None


def next_probe(probes: Mapping[str, ProbeResult]) -> str | None:
    """The next path to ask, given what ``probes`` holds, or ``None`` when nothing more helps.

    A Llama Stack is asked its version and which completion routes it serves; anything else
    ``/health``, then ``/v1/models``. Once the kind is settled, ``/v1/models`` is still asked
    once (unless asked already), so the log can name the models the upstream serves."""
    if detect_kind(probes) is not None:
        return None if "/v1/models" in probes else "/v1/models"
    if "/v1/health" not in probes:
        return "/v1/health"
    order: tuple[str, ...]
    if _llama_stack_health(probes):
        order = ("/v1/version", "/v1/chat/completions", "/v1/inference/chat-completion")
    else:
        order = ("/health", "/v1/models")
    return next((p for p in order if p not in probes), None)


def describe_probes(probes: Mapping[str, ProbeResult]) -> str:
    """What the probe found, for the log: each path's status (and ``/v1/version``'s release),
    and the models ``/v1/models`` lists (OpenAI's ``id``, Llama Stack 0.2's ``identifier``)."""
    parts = []
    for path, result in probes.items():
        status = str(result.status)
        if result.status is None:
            status = f"no answer ({result.reason})" if result.reason else "no answer"
        if path == "/v1/version" and result.status == 200:
            with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
                status += f" (version {orjson.loads(result.body).get('version')})"
        parts.append(f"{path} {status}")
    models = _model_ids(probes.get("/v1/models"))
    if models:
        parts.append("models " + ", ".join(models))
    return "; ".join(parts)


def _model_ids(result: ProbeResult | None, most: int = 5) -> list[str]:
    if result is None or result.status != 200:
        return []
    try:
        doc = orjson.loads(result.body)
    except orjson.JSONDecodeError:
        return []
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return []
    ids = [
        str(m.get("id") or m.get("identifier"))
        for m in data
        if isinstance(m, dict) and (m.get("id") or m.get("identifier"))
    ]
    return ids[:most] + ([f"... ({len(ids)} in all)"] if len(ids) > most else [])


async def probe_kind(
    pool: ConnectionPool,
    *,
    found: dict[str, ProbeResult] | None = None,
) -> KindName | None:
    """Ask the upstream behind ``pool`` the paths :func:`next_probe` names, and return
    :func:`detect_kind`'s answer. ``found``, where given, is filled with what each path answered
    (for :func:`describe_probes`). The caller bounds it in time (``asyncio.timeout``); a path
    that gets no answer counts as ``None``."""
    probes: dict[str, ProbeResult] = {} if found is None else found
    while (path := next_probe(probes)) is not None:
        try:
            response = await pool.call("GET", path, limit=_PROBE_BODY)
        except ConnectFailed as exc:  # a TLS failure named as one
            probes[path] = ProbeResult(None, reason=connect_failure(exc)[:200])
        except UpstreamError as exc:
            probes[path] = ProbeResult(None, reason=f"{type(exc).__name__}: {exc}"[:200])
        else:
            probes[path] = ProbeResult(response.status, response.body)
    return detect_kind(probes)
