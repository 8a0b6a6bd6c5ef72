"""What the gateway knows about each kind of upstream: vLLM, Llama Stack, or any OpenAI-compatible
server. A table and small pure functions, no I/O: which kind an upstream is, the gateway asks it
(:mod:`~streamsafe.gateway.upstream.probe`).

Each :class:`UpstreamKind` says which completion routes the gateway serves with its promises
(coalescing, replay, resume, admission, breaker) and how each maps to the upstream, the wire
format of each (:class:`~streamsafe.gateway.upstream.wire.Wire`), how the upstream ends a stream,
how it reports an error after the response started, where to ask for its health, and whether a
broken stream can be continued there.

Measured on Llama Stack 0.2.12 with the ``remote::vllm`` provider (see docs/design.md,
Positions around Llama Stack):

- Native routes ``/v1/inference/chat-completion`` and ``/v1/inference/completion`` stream
  ``data: {"event": {"event_type": "start" | "progress" | "complete", "delta": ...}}`` (chat) and
  ``data: {"delta": "...", "stop_reason": ...}`` (completion); OpenAI routes live under
  ``/v1/openai/v1/``. No stream ends with ``data: [DONE]``: it just ends, after the ``complete``
  event (native chat), a chunk with a ``stop_reason`` (native completion) or a chunk with a
  ``finish_reason`` (OpenAI routes).
- It answers 200 and sends headers at once for every stream, and reports any failure after that,
  the engine's included, as one masked event ``{"error": {"message": "500: Internal server error:
  An unexpected error occurred."}}`` (the status is the message's prefix), then ends the stream.
  These count as upstream failures. Non-streaming failures are real statuses with
  ``{"detail": ...}`` bodies.
- ``/v1/health`` answers for Llama Stack itself, not the engine behind it.
- A request cannot ask Llama Stack to continue a partial answer (its routes accept no
  ``continue_final_message``), so a broken stream there ends with an error event for the caller.

Today's Llama Stack, OGX 1.x (the project renamed) and llama-stack >= 0.4 (0.7.3 measured), is the
``ogx`` kind: the native routes and the ``/v1/openai/v1`` prefix are gone; the OpenAI routes are
``/v1/chat/completions`` and ``/v1/completions``, streamed as ``data:`` lines with no ``[DONE]``
(the answer ends with the chunk carrying its ``finish_reason``); models are named
``vllm/<engine's id>``; an error after the response started is one event ``{"error":
{"message", "code": "NNN"}}``; ``/v1/health`` answers ``{"status": "OK"}`` for the server, not the
engine, and ``/v1/version`` its release.

vLLM (and the simulator) ends streams with ``data: [DONE]``, reports a mid-stream failure as
``data: {"error": {...}}`` then ``[DONE]``, answers ``/health`` (503 once the engine is dead) and
continues a partial chat answer with ``continue_final_message``. A generic OpenAI-compatible
server is assumed to offer none of vLLM's extras.

The events of a stream are read elsewhere, by wire format: whether one closes the answer
(:mod:`~streamsafe.gateway.upstream.answer_end`), the error one reports
(:mod:`~streamsafe.gateway.upstream.error_events`); and a request is read for its cost as the
OpenAI request it stands for (:mod:`~streamsafe.gateway.upstream.request_views`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Telling kinds apart is :mod:`~streamsafe.gateway.upstream.probe`'s.
from streamsafe.gateway.upstream.probe import KindName
from streamsafe.gateway.upstream.wire import Wire

__all__ = [
    "KINDS",
    "POOLING_PATHS",
    "CompletionRoute",
    "KindName",
    "UpstreamKind",
    "Wire",
    "describe_kind",
]


@dataclass(frozen=True, slots=True)
class CompletionRoute:
    """One completion route the gateway serves with every promise.

    ``path`` is what clients call, ``upstream_path`` where the gateway sends it.
    ``upstream_done``: the upstream ends a whole stream with ``data: [DONE]``. ``client_done``:
    the gateway ends the stream it serves with ``data: [DONE]`` (llama-stack-client 0.2.x
    JSON-decodes every event, so routes it calls must not). ``preamble``: events the upstream
    sends before the engine's first token (Llama Stack's native chat sends its ``start`` event
    at once); heartbeats go on until events past them flow. ``token_ids``: the upstream sends
    the token ids of a stream on request (vLLM's ``return_token_ids``), so the gateway asks for
    them and a broken stream is continued by ids, exactly (see
    :mod:`streamsafe.gateway.relay.continuation`).
    """

    path: str
    upstream_path: str
    wire: Wire
    upstream_done: bool
    client_done: bool
    preamble: int = 0
    token_ids: bool = False

    @property
    def reset_on_failure(self) -> bool:
        """A stream that failed after commit ends with a connection reset: the gateway serves
        it Llama Stack's way (no ``[DONE]``) for an upstream that ends streams with one, and
        llama-stack-client reads an error event as an ordinary chunk, so a clean end would pass
        for a whole answer. Behind Llama Stack, its own ending is relayed as it came."""
        return self.upstream_done and not self.client_done


@dataclass(frozen=True, slots=True)
class UpstreamKind:
    """Everything kind-specific about an upstream (see the module docstring for the facts).

    ``health_path``: where to ask whether the upstream is up. ``health_covers_engine``: whether
    that answer reflects the engine (vLLM's ``/health`` turns 503 when the engine dies; Llama
    Stack's ``/v1/health`` does not), so a breaker knows whether it can close on it.
    ``models_path``: the upstream's model list. ``passthrough``: requests to any other path are
    forwarded unchanged (Llama Stack has many APIs besides inference). ``can_continue``: a broken
    chat stream can be continued from its partial answer. ``masks_errors``: failures after the
    response started arrive as ``"NNN: ..."`` messages whose prefix is the status.
    ``tokenize_path``: where the upstream counts a request's prompt tokens (vLLM's
    ``/tokenize``), or ``None`` where it cannot.
    """

    name: KindName
    health_path: str
    health_covers_engine: bool
    models_path: str
    routes: Mapping[str, CompletionRoute]
    passthrough: bool
    can_continue: bool
    masks_errors: bool
    tokenize_path: str | None = None

    def route(self, path: str) -> CompletionRoute | None:
        """The completion route served at ``path``, or ``None``."""
        return self.routes.get(path)


def _routes(*routes: CompletionRoute) -> Mapping[str, CompletionRoute]:
    return {r.path: r for r in routes}


#: vLLM's pooling routes, served as plain calls (:data:`Wire.OPENAI_POOLING`).
POOLING_PATHS = (
    "/v1/embeddings",
    "/v2/embed",
    "/pooling",
    "/classify",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
)

_OPENAI_ROUTES = (
    CompletionRoute("/v1/chat/completions", "/v1/chat/completions", Wire.OPENAI_CHAT, True, True),
    CompletionRoute("/v1/completions", "/v1/completions", Wire.OPENAI_COMPLETION, True, True),
)

#: The kinds by name.
KINDS: Mapping[KindName, UpstreamKind] = {
    "vllm": UpstreamKind(
        name="vllm",
        health_path="/health",
        health_covers_engine=True,
        models_path="/v1/models",
        routes=_routes(
            CompletionRoute(
                "/v1/chat/completions",
                "/v1/chat/completions",
                Wire.OPENAI_CHAT,
                True,
                True,
                token_ids=True,
            ),
            CompletionRoute(
                "/v1/completions",
                "/v1/completions",
                Wire.OPENAI_COMPLETION,
                True,
                True,
                token_ids=True,
            ),
            # Pooling: plain JSON calls, coalesced and replayed as a plain chat is.
            *(
                CompletionRoute(path, path, Wire.OPENAI_POOLING, True, True)
                for path in POOLING_PATHS
            ),
            # Llama Stack's OpenAI aliases, served in Llama Stack's way (no [DONE]) so
            # llama-stack-client 0.2.x can talk to a gateway standing in for Llama Stack.
            CompletionRoute(
                "/v1/openai/v1/chat/completions",
                "/v1/chat/completions",
                Wire.OPENAI_CHAT,
                True,
                False,
                token_ids=True,
            ),
            CompletionRoute(
                "/v1/openai/v1/completions",
                "/v1/completions",
                Wire.OPENAI_COMPLETION,
                True,
                False,
                token_ids=True,
            ),
            # Anthropic's Messages API, which vLLM serves natively (streams end without [DONE]).
            CompletionRoute("/v1/messages", "/v1/messages", Wire.ANTHROPIC_MESSAGES, False, False),
            # vLLM's own Responses API, served as OGX's is: response.created and
            # response.in_progress come before the first token; no [DONE].
            CompletionRoute(
                "/v1/responses", "/v1/responses", Wire.OPENAI_RESPONSES, False, False, preamble=2
            ),
        ),
        passthrough=False,
        can_continue=True,
        masks_errors=False,
        tokenize_path="/tokenize",
    ),
    "llama-stack": UpstreamKind(
        name="llama-stack",
        health_path="/v1/health",
        health_covers_engine=False,
        models_path="/v1/models",
        routes=_routes(
            CompletionRoute(
                "/v1/inference/chat-completion",
                "/v1/inference/chat-completion",
                Wire.LLAMA_STACK_CHAT,
                False,
                False,
                preamble=1,
            ),
            CompletionRoute(
                "/v1/inference/completion",
                "/v1/inference/completion",
                Wire.LLAMA_STACK_COMPLETION,
                False,
                False,
            ),
            CompletionRoute(
                "/v1/openai/v1/chat/completions",
                "/v1/openai/v1/chat/completions",
                Wire.OPENAI_CHAT,
                False,
                False,
            ),
            CompletionRoute(
                "/v1/openai/v1/completions",
                "/v1/openai/v1/completions",
                Wire.OPENAI_COMPLETION,
                False,
                False,
            ),
        ),
        passthrough=True,
        can_continue=False,
        masks_errors=True,
    ),
    "ogx": UpstreamKind(
        name="ogx",
        health_path="/v1/health",
        health_covers_engine=False,
        models_path="/v1/models",
        routes=_routes(
            CompletionRoute(
                "/v1/chat/completions", "/v1/chat/completions", Wire.OPENAI_CHAT, False, False
            ),
            CompletionRoute(
                "/v1/completions", "/v1/completions", Wire.OPENAI_COMPLETION, False, False
            ),
            # response.created and response.in_progress come at once, before the engine's
            # first token.
            CompletionRoute(
                "/v1/responses", "/v1/responses", Wire.OPENAI_RESPONSES, False, False, preamble=2
            ),
        ),
        passthrough=True,
        can_continue=False,
        masks_errors=True,
    ),
    "openai": UpstreamKind(
        name="openai",
        health_path="/v1/models",
        health_covers_engine=False,
        models_path="/v1/models",
        routes=_routes(*_OPENAI_ROUTES),
        passthrough=True,
        can_continue=False,
        masks_errors=False,
    ),
}


def describe_kind(kind: UpstreamKind) -> str:
    """What the gateway does with ``kind``'s routes, for the log."""
    served = ", ".join(kind.routes)
    rest = (
        "passes every other route through"
        if kind.passthrough
        else "passes vLLM's other routes as its route table says (upstream/routes.py)"
    )
    return f"serves POST {served} with every promise; {rest}"
