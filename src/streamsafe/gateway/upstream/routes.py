"""Every route of a vLLM upstream (0.32), and what the gateway guarantees on each: one table
(:data:`ROUTES`), read by the gateway's routing and rendered in docs/gateway.md (a test checks
that the two agree).

Each :class:`Route` says how the gateway handles the path (:class:`Handling`): served with every
promise (coalescing, replay, resume, continuation, admission: the completion routes of
:mod:`~streamsafe.gateway.upstream.kinds`, and the pooling routes as plain calls), admitted
(routed by its ``model`` across the pool, the tenant's key checked, admission by what it costs,
then passed through), sent to a live engine (routes that take no model), answered by the
gateway itself, or kept for the operator (the admin key only: they change or reveal the engine
for everyone). The Anthropic Messages API is served as chat is (its own wire format, see
docs/gateway.md, Messages). A path no entry names answers 404.

The list was read from vLLM 0.32's ``vllm/entrypoints`` (``@router.`` and ``add_api_route``):
some routes exist only where the model serves the task (pooling routes for a pooling model,
audio for a speech model) or where a flag enables them (``VLLM_SERVER_DEV_MODE`` for sleep,
cache and RPC routes, a profiler config for profiling, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` for
adapters); the gateway lists them all, and the engine answers 404 for those it does not serve,
through the gateway as straight. ``/v1/realtime`` is a WebSocket, which the gateway does not
carry; ``/metrics`` and ``/health`` are the gateway's own (an engine's are read from it
directly, or by the gateway's probes).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from streamsafe.gateway.upstream.kinds import POOLING_PATHS

__all__ = [
    "ROUTES",
    "Cost",
    "Handling",
    "Route",
    "find_route",
    "markdown_table",
    "operator_route",
    "route_label",
]


class Handling(enum.Enum):
    """What the gateway does with a route's requests."""

    #: Coalescing, replay, resume, continuation of a cut stream, admission, failover
    #: (:mod:`streamsafe.gateway.serving.completions`); a pooling route's plain calls are
    #: coalesced, replayed and admitted by their input tokens the same way.
    SERVED = "served"
    #: The tenant's key checked, routed by ``model`` across the pool (a live engine where it names
    #: none), admitted by its cost, then passed through as it came; no coalescing.
    ADMITTED = "admitted"
    #: The tenant's key checked, then passed to a live engine (it takes no model).
    ENGINE = "engine"
    #: Answered by the gateway itself.
    GATEWAY = "gateway"
    #: Only with the gateway's admin key (403 without): passed to the first engine.
    OPERATOR = "operator"


class Cost(enum.Enum):
    """What admission counts for a request of the route, in engine tokens."""

    #: Nothing: no admission (cheap, or no engine memory).
    NONE = "none"
    #: Its input tokens (estimated from the text, as for a completion's prompt).
    INPUT = "input"
    #: Its input tokens plus its output limit (a generation).
    GENERATION = "generation"
    #: A flat ``default_max_tokens`` (an audio file, whose tokens the gateway cannot count).
    FLAT = "flat"


@dataclass(frozen=True, slots=True)
class Route:
    """One route: ``path`` (``{id}`` stands for one path segment), the ``methods`` it accepts,
    its :class:`Handling`, whether it ``takes_model`` (routed by its ``model`` field), its
    admission :class:`Cost`, whether its body is ``multipart`` (streamed, its ``model`` field
    read from the start), whether it reads state one tenant left upstream (``tenant_state``:
    refused to tenants where ``tenant_passthrough`` is ``refuse``), and a ``note`` for the
    docs."""

    path: str
    methods: tuple[str, ...]
    handling: Handling
    takes_model: bool = False
    cost: Cost = Cost.NONE
    multipart: bool = False
    tenant_state: bool = False
    note: str = ""

    @property
    def guarantees(self) -> str:
        """What the gateway guarantees on the route, in words (the docs' column)."""
        if self.handling is Handling.SERVED and self.path == "/v1/responses":
            return "coalescing, replay, resume (`starting_after`), cancel, admission, failover"
        if self.handling is Handling.SERVED and self.cost is Cost.INPUT:
            return "coalescing, replay, admission by input tokens, failover (plain calls)"
        if self.handling is Handling.SERVED:
            return "coalescing, replay, resume, continuation, admission, failover"
        if self.handling is Handling.ADMITTED:
            counted = {
                Cost.NONE: "no admission",
                Cost.INPUT: "admission by input tokens",
                Cost.GENERATION: "admission by input + output limit",
                Cost.FLAT: "admission by a flat cost",
            }[self.cost]
            return f"routed by model, {counted}, pass-through"
        if self.handling is Handling.ENGINE:
            return "a live engine, pass-through"
        if self.handling is Handling.GATEWAY:
            return "answered by the gateway"
        return "admin key only (403 without), pass-through"


_POST = ("POST",)
_GET = ("GET", "HEAD")


def _admitted(path: str, cost: Cost, note: str = "", **kw: bool) -> Route:
    return Route(path, _POST, Handling.ADMITTED, takes_model=True, cost=cost, note=note, **kw)


def _operator(path: str, methods: tuple[str, ...] = _POST, note: str = "") -> Route:
    return Route(path, methods, Handling.OPERATOR, note=note)


#: Every route, in the docs' order.
ROUTES: tuple[Route, ...] = (
    # -- the completions, with every promise ------------------------------------------------
    Route("/v1/chat/completions", _POST, Handling.SERVED, True, Cost.GENERATION),
    Route("/v1/completions", _POST, Handling.SERVED, True, Cost.GENERATION),
    Route(
        "/v1/openai/v1/chat/completions",
        _POST,
        Handling.SERVED,
        True,
        Cost.GENERATION,
        note="Llama Stack 0.2's alias, no `[DONE]`",
    ),
    Route(
        "/v1/openai/v1/completions",
        _POST,
        Handling.SERVED,
        True,
        Cost.GENERATION,
        note="Llama Stack 0.2's alias, no `[DONE]`",
    ),
    # -- generations passed through, admitted ------------------------------------------------
    _admitted("/v1/chat/completions/batch", Cost.GENERATION),
    _admitted("/cohere/v2/chat", Cost.GENERATION),
    _admitted("/inference/v1/generate", Cost.GENERATION, "tokens in, tokens out"),
    _admitted("/invocations", Cost.GENERATION, "SageMaker: the task its body names"),
    _admitted("/generative_scoring", Cost.INPUT),
    _admitted("/v1/systemone", Cost.GENERATION),
    # -- pooling: embeddings, classify, score, rerank: plain calls ----------------------------
    *(
        Route(path, _POST, Handling.SERVED, True, Cost.INPUT, note="a pooling model's")
        for path in POOLING_PATHS
    ),
    # -- audio: multipart, streamed -----------------------------------------------------------
    _admitted(
        "/v1/audio/transcriptions",
        Cost.FLAT,
        "multipart, streamed; `model` read from the form's start",
        multipart=True,
    ),
    _admitted(
        "/v1/audio/translations",
        Cost.FLAT,
        "multipart, streamed; `model` read from the form's start",
        multipart=True,
    ),
    # -- the tokenizer: routed by model, no engine memory ------------------------------------
    _admitted("/tokenize", Cost.NONE),
    _admitted("/detokenize", Cost.NONE),
    _admitted("/v1/chat/completions/render", Cost.NONE),
    _admitted("/v1/completions/render", Cost.NONE),
    _admitted("/v1/responses/render", Cost.NONE),
    _admitted("/v1/chat/completions/derender", Cost.NONE),
    _admitted("/v1/completions/derender", Cost.NONE),
    # -- routes that take no model --------------------------------------------------------------
    Route(
        "/v1/responses/{id}",
        _GET,
        Handling.ENGINE,
        tenant_state=True,
        note="the engine that holds it",
    ),
    Route(
        "/v1/responses/{id}/cancel",
        _POST,
        Handling.ENGINE,
        tenant_state=True,
        note="the engine that holds it",
    ),
    Route("/tokenizer_info", _GET, Handling.ENGINE),
    Route("/version", _GET, Handling.ENGINE),
    Route("/load", _GET, Handling.ENGINE),
    Route("/ping", ("GET", "HEAD", "POST"), Handling.ENGINE),
    # -- the gateway's own ----------------------------------------------------------------------
    Route("/health", _GET, Handling.GATEWAY, note="the gateway's liveness"),
    Route("/ready", _GET, Handling.GATEWAY, note="some engine takes work"),
    Route("/metrics", _GET, Handling.GATEWAY, note="the gateway's; admin key where set"),
    Route("/stats", _GET, Handling.GATEWAY, note="admin key where set"),
    Route("/v1/models", _GET, Handling.GATEWAY, note="the pool's, or a live engine's"),
    Route("/v1/openai/v1/models", _GET, Handling.GATEWAY, note="Llama Stack 0.2's alias"),
    # -- the Anthropic Messages API (docs/gateway.md, Messages) -------------------------------
    Route("/v1/messages", _POST, Handling.SERVED, True, Cost.GENERATION),
    Route(
        "/v1/responses",
        _POST,
        Handling.SERVED,
        True,
        Cost.GENERATION,
        tenant_state=True,
        note="`previous_response_id` or `conversation` read stored state",
    ),
    Route("/v1/messages/count_tokens", _POST, Handling.ADMITTED, True),
    Route("/v1/messages/render", _POST, Handling.ADMITTED, True),
    # -- operator routes: never a tenant's ---------------------------------------------------
    _operator("/sleep", note="dev mode"),
    _operator("/wake_up", note="dev mode"),
    _operator("/is_sleeping", _GET, "dev mode"),
    _operator("/release_kv_cache_memory", note="dev mode"),
    _operator("/reset_prefix_cache", note="dev mode"),
    _operator("/reset_mm_cache", note="dev mode"),
    _operator("/reset_encoder_cache", note="dev mode"),
    _operator("/collective_rpc", note="dev mode"),
    _operator("/server_info", _GET, "dev mode"),
    _operator("/pause", note="dev mode (RL)"),
    _operator("/resume", note="dev mode (RL)"),
    _operator("/is_paused", _GET, "dev mode (RL)"),
    _operator("/abort_requests", note="any caller's requests"),
    _operator("/inference/v1/abort_requests", note="any caller's requests"),
    _operator("/init_weight_transfer_engine", note="dev mode (RL)"),
    _operator("/shutdown_weight_transfer_engine", note="dev mode (RL)"),
    _operator("/start_weight_update", note="dev mode (RL)"),
    _operator("/start_draft_weight_update", note="dev mode (RL)"),
    _operator("/update_weights", note="dev mode (RL)"),
    _operator("/finish_weight_update", note="dev mode (RL)"),
    _operator("/update_weight_version", note="dev mode (RL)"),
    _operator("/weight_info", _GET, "dev mode (RL)"),
    _operator("/weight_checker", note="dev mode (RL)"),
    _operator("/get_world_size", _GET, "dev mode (RL)"),
    _operator("/start_profile", note="with a profiler config"),
    _operator("/stop_profile", note="with a profiler config"),
    _operator("/v1/load_lora_adapter", note="VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
    _operator("/v1/unload_lora_adapter", note="VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
    _operator("/scale_elastic_ep"),
    _operator("/is_scaling_elastic_ep"),
    _operator("/fault_tolerance/apply", note="--enable-fault-tolerance"),
    _operator("/fault_tolerance/status", _GET, "--enable-fault-tolerance"),
    _operator("/kv_event_sources", _GET),
)

_EXACT: Mapping[str, Route] = {r.path: r for r in ROUTES if "{" not in r.path}
_RESPONSE = next(r for r in ROUTES if r.path == "/v1/responses/{id}")
_RESPONSE_CANCEL = next(r for r in ROUTES if r.path == "/v1/responses/{id}/cancel")
_OPERATOR_PATHS = frozenset(r.path for r in ROUTES if r.handling is Handling.OPERATOR)


def find_route(path: str) -> Route | None:
    """The route ``path`` (as the gateway routes it: decoded, no trailing slash) is, or
    ``None``."""
    found = _EXACT.get(path)
    if found is not None:
        return found
    if path.startswith("/v1/responses/"):
        rest = path[len("/v1/responses/") :]
        if rest and "/" not in rest:
            return _RESPONSE
        head, _, tail = rest.partition("/")
        if head and tail == "cancel":
            return _RESPONSE_CANCEL
    return None


def operator_route(path: str) -> bool:
    """True if ``path`` is an operator route (whatever the upstream's kind: a vLLM behind the
    ``openai`` kind has them too)."""
    return path in _OPERATOR_PATHS


def route_label(path: str) -> str:
    """The ``route`` label of a request on ``path``: its table entry's path, ``other`` for a
    path no entry names (so the label's values are bounded by the table)."""
    found = find_route(path)
    return found.path if found is not None else "other"


def markdown_table() -> str:
    """:data:`ROUTES` as the Markdown table docs/gateway.md shows (a test checks they agree)."""
    lines = [
        "| route | methods | handled | takes a model | guarantees | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in ROUTES:
        methods = ", ".join(m for m in r.methods if m != "HEAD")
        model = "yes" if r.takes_model else "no"
        note = "; ".join(filter(None, (r.note, "tenant state" if r.tenant_state else "")))
        lines.append(
            f"| `{r.path}` | {methods} | {r.handling.value} | {model} | {r.guarantees} | {note} |"
        )
    return "\n".join(lines) + "\n"
