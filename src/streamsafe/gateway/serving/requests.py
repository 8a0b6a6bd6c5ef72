"""Reading a completion request: its headers, its body, and what they ask of the gateway.

Everything here raises :class:`~streamsafe.gateway.errors.BadRequest` on bad input, so a client
gets a clear 4xx with an OpenAI error body.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Mapping
from typing import Any

import orjson

from streamsafe.gateway.admission.admission import request_cost
from streamsafe.gateway.errors import BadRequest
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.relay.continuation import with_token_ids
from streamsafe.gateway.serving.body_work import MAX_JSON_CONTAINERS, exceeds_containers
from streamsafe.gateway.upstream.kinds import CompletionRoute, Wire
from streamsafe.gateway.upstream.request_views import cost_view
from streamsafe.request_cost import MAX_REQUEST_COST, InvalidField, is_deterministic
from streamsafe.server.asgi import BodyTooLarge, Disconnected, Receive, Scope, header, read_body
from streamsafe.tokens import estimate_input_tokens

__all__ = [
    "FORWARDED_HEADERS",
    "client_read_timeout",
    "completion_request",
    "forwarded_headers",
    "last_attempt",
    "read_request_body",
    "tenant_id",
]

#: Longest Idempotency-Key accepted (the IETF draft sets no limit; a key is a store key here).
_MAX_KEY_LEN = 256
_VISIBLE_ASCII = re.compile(rb"[\x21-\x7e]+")
#: Deepest JSON nesting accepted in a request body: one limit for parsing and for the
#: fingerprint (orjson parses 1024 levels but serialises only 254). Real requests (tool schemas
#: included) nest a few dozen levels.
MAX_JSON_DEPTH = 128
_TOO_DEEP = f"request body nests deeper than {MAX_JSON_DEPTH} levels"


def tenant_id(api_key: bytes) -> str:
    """The name a tenant is known by: a digest of its key, so that no key is ever held in a
    log line, a metric or a stats dump."""
    return "t-" + hashlib.sha256(api_key).hexdigest()[:16]


async def read_request_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The body, refused with 413 past ``limit`` bytes (by ``Content-Length`` before reading,
    where one is given) and with 400 if the client leaves half-way."""
    declared = header(scope, b"content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BadRequest(400, "invalid Content-Length") from None
        if size > limit:
            raise BadRequest(413, f"request body is {size} bytes; the limit is {limit}")
    try:
        return await read_body(receive, limit)
    except BodyTooLarge:
        raise BadRequest(413, f"request body is over the limit of {limit} bytes") from None
    except Disconnected:
        raise BadRequest(400, "client disconnected before the body was complete") from None


def completion_request(
    scope: Scope,
    raw: bytes,
    route: CompletionRoute,
    tenant: str,
    default_max_tokens: int,
    forward_authorization: bool = False,
) -> GenerationRequest:
    """What the registry needs to know about a completion request with body ``raw`` on
    ``route``; with ``forward_authorization``, the caller's ``Authorization`` goes upstream
    with it."""
    upstream_path = route.upstream_path
    body = _parse_body(raw, route.wire)
    key = header(scope, b"idempotency-key")
    if key is not None and (
        not key or len(key) > _MAX_KEY_LEN or not _VISIBLE_ASCII.fullmatch(key)
    ):
        # Visible ASCII only: undecodable bytes must never collapse into one key.
        raise BadRequest(
            400,
            f"Idempotency-Key must be 1 to {_MAX_KEY_LEN} visible ASCII characters",
            "Idempotency-Key",
        )
    last_id = _last_event_id(scope)
    forward = forwarded_headers(scope, authorization=forward_authorization)
    # Requests that reach the upstream with other provider keys are not the same work.
    fingerprint = hashlib.blake2b(
        upstream_path.encode()
        + b"\0"
        + orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
        + (b"\0" + forward if forward else b""),
        digest_size=16,
    ).digest()
    pooling = route.wire is Wire.OPENAI_POOLING
    stream = body.get("stream") is True and not pooling
    view, chat = cost_view(route.wire, body)
    # A stream asks vLLM for its token ids, so a broken one is continued exactly (the fingerprint
    # above is the caller's body: retries still find it).
    upstream_body = (with_token_ids(body) if stream and route.token_ids else None) or raw
    return GenerationRequest(
        tenant=tenant,
        path=upstream_path,
        body=upstream_body,
        fingerprint=fingerprint,
        cost=_input_cost(body) if pooling else _cost(view, chat, route.wire, default_max_tokens),
        # A pooling answer is a function of its input: one answer, whoever asks.
        deterministic=pooling or is_deterministic(view),
        stream=stream,
        idempotency_key=key.decode("ascii") if key is not None else None,
        retry=_retry_count(scope) >= 1,
        last_event_id=last_id,
        no_upstream_retry=header(scope, b"x-llamastack-streaming") == b"true",
        route=route,
        forward=forward,
        model=model if isinstance(model := body.get("model"), str) else "",
    )


def _cost(view: Mapping[str, object], chat: bool, wire: Wire, default_max_tokens: int) -> int:
    """The engine memory the request (read as ``view``, see ``cost_view``) may take; a number
    the engine would refuse is the caller's 400 here, before it costs a place in the queue."""
    try:
        return request_cost(view, default_max_tokens, chat=chat)
    except InvalidField as exc:
        # The view's limit is named as the caller's body names it.
        field = _LIMIT_NAMES.get(wire, exc.field) if exc.field == "max_tokens" else exc.field
        raise BadRequest(400, str(exc).replace(exc.field, field), field) from None


def _input_cost(body: Mapping[str, Any]) -> int:
    """The engine memory a pooling request takes: its input tokens (no output)."""
    return min(MAX_REQUEST_COST, max(1, estimate_input_tokens(body)))


_LIMIT_NAMES = {
    Wire.OPENAI_RESPONSES: "max_output_tokens",
    Wire.LLAMA_STACK_CHAT: "sampling_params.max_tokens",
    Wire.LLAMA_STACK_COMPLETION: "sampling_params.max_tokens",
}


#: The caller's headers a completion request carries upstream: Llama Stack's per-request
#: provider data (API keys, endpoints) under both its names, OGX's and Llama Stack's before it
#: (llama-stack-client 0.7 and older, still read by llama-stack 0.7.3). They are part of the
#: work asked for, so they are part of the fingerprint too.
FORWARDED_HEADERS = (b"x-ogx-provider-data", b"x-llamastack-provider-data")


def forwarded_headers(scope: Scope, *, authorization: bool = False) -> bytes:
    """The :data:`FORWARDED_HEADERS` the request carries, as header lines (``b""`` for none);
    with ``authorization``, the caller's ``Authorization`` too."""
    lines = b""
    for name in (*FORWARDED_HEADERS, b"authorization") if authorization else FORWARDED_HEADERS:
        value = header(scope, name)
        if value is not None:
            lines += b"%s: %s\r\n" % (name, value)
    return lines


def client_read_timeout(scope: Scope) -> float | None:
    """The client's read timeout in seconds, where it said (Stainless clients send
    ``x-stainless-read-timeout``); ``None`` when absent or not a sane number of seconds."""
    value = header(scope, b"x-stainless-read-timeout")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0 < seconds < 86_400 else None


#: Stainless clients' default number of retries (openai, llama-stack-client): an attempt whose
#: retry count reached it is the client's last.
STAINLESS_MAX_RETRIES = 2


def last_attempt(scope: Scope) -> bool:
    """Whether the request says it is its client's last attempt (``x-stainless-retry-count`` or
    ``x-retry-count`` at the Stainless default of 2 retries)."""
    return _retry_count(scope) >= STAINLESS_MAX_RETRIES


def _retry_count(scope: Scope) -> int:
    best = 0
    for key, value in scope["headers"]:
        if key == b"x-retry-count" or key == b"x-stainless-retry-count":
            with contextlib.suppress(ValueError):
                best = max(best, int(value))
    return best


def _last_event_id(scope: Scope) -> int | None:
    value = header(scope, b"last-event-id")
    if value is None or not value.strip():
        return None
    try:
        n = int(value)
    except ValueError:
        raise BadRequest(400, "Last-Event-ID must be an event id this gateway sent") from None
    if n < -1:
        raise BadRequest(400, "Last-Event-ID must be >= -1")
    return n


def _parse_body(raw: bytes, wire: Wire) -> dict[str, Any]:
    if not raw:
        raise BadRequest(400, "request body is empty; expected a JSON object")
    if exceeds_containers(raw, MAX_JSON_CONTAINERS):  # before the parse, which it bounds
        raise BadRequest(
            400, f"request body holds more than {MAX_JSON_CONTAINERS:,} JSON objects and arrays"
        )
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "recursion" in str(exc).lower() or "depth" in str(exc).lower():
            raise BadRequest(400, _TOO_DEEP) from None
        raise BadRequest(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "request body must be a JSON object")
    # No more brackets than the limit (in strings too): it cannot nest deeper, and the usual
    # body is told so by two scans in C.
    brackets = raw.count(b"{") + raw.count(b"[")
    if brackets > MAX_JSON_DEPTH and _nests_deeper(body, MAX_JSON_DEPTH):
        raise BadRequest(400, _TOO_DEEP)
    model_field = wire.model_field
    model = body.get(model_field)
    if wire is Wire.OPENAI_POOLING:
        # vLLM's pooling requests may leave the model out; every other field is the engine's
        # to read (each route has its own: input, query and documents, text_1 and text_2).
        if model is not None and not isinstance(model, str):
            raise BadRequest(400, f"'{model_field}' must be a string", model_field)
        return body
    if not isinstance(model, str) or not model:
        raise BadRequest(400, f"missing required field '{model_field}'", model_field)
    if wire.is_chat:
        _check_messages(body.get("messages"), native=wire is Wire.LLAMA_STACK_CHAT)
    elif wire is Wire.LLAMA_STACK_COMPLETION:
        if "content" not in body or body["content"] is None:
            raise BadRequest(400, "missing required field 'content'", "content")
    elif wire is Wire.ANTHROPIC_MESSAGES:
        _check_messages(body.get("messages"))
        if body.get("max_tokens") is None:
            raise BadRequest(400, "missing required field 'max_tokens'", "max_tokens")
    elif wire is Wire.OPENAI_RESPONSES:
        given = body.get("input")
        if not (isinstance(given, str) and given) and not (isinstance(given, list) and given):
            raise BadRequest(400, "missing required field 'input' (a string or items)", "input")
    else:
        _check_prompt(body.get("prompt"))
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest(400, "'stream' must be a boolean", "stream")
    if wire is Wire.LLAMA_STACK_CHAT or wire is Wire.LLAMA_STACK_COMPLETION:
        params = body.get("sampling_params")
        if params is not None and not isinstance(params, dict):
            raise BadRequest(400, "'sampling_params' must be an object", "sampling_params")
    return body


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether JSON ``value`` nests more than ``limit`` containers deep (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, dict | list))
    return False


def _check_messages(messages: Any, *, native: bool = False) -> None:
    """Chat messages as the gateway itself reads them (roles, text parts), each fault named by
    its field. ``native``: Llama Stack's native chat, where a content may also be one part
    object instead of a list of them."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest(400, "missing required field 'messages' (a non-empty list)", "messages")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest(400, "each message must be an object with a 'role'", f"messages[{i}]")
        content = msg.get("content")
        if content is None or isinstance(content, str):
            continue
        if native and isinstance(content, dict):
            content = [content]
        if not isinstance(content, list):
            param = f"messages[{i}].content"
            raise BadRequest(400, f"'{param}' must be a string or a list of parts", param)
        for j, part in enumerate(content):
            param = f"messages[{i}].content[{j}]"
            if not isinstance(part, dict):
                raise BadRequest(400, f"'{param}' must be an object", param)
            if not isinstance(part.get("type"), str):
                raise BadRequest(400, f"'{param}.type' must be a string", param + ".type")
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise BadRequest(400, f"'{param}.text' must be a string", param + ".text")


def _check_prompt(prompt: Any) -> None:
    # A string, strings, token ids, or lists of token ids (OpenAI's four prompt forms).
    if isinstance(prompt, str) or (
        isinstance(prompt, list)
        and prompt
        and (all(isinstance(p, str) for p in prompt) or all(_is_token_ids(p) for p in prompt))
    ):
        return
    raise BadRequest(
        400,
        "missing or malformed field 'prompt': a string, a list of strings, or token ids",
        "prompt",
    )


def _is_token_ids(value: Any) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return True
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )
