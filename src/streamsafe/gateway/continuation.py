"""Continuing a chat stream whose upstream connection broke (see docs/design.md, Continuation).

When the stream from the engine ends with no error and no ``[DONE]`` (a proxy or the connection
died), the engine aborted its copy when the connection closed. Asking it to continue the partial
answer (vLLM's ``continue_final_message``) for the tokens still owed generates nothing twice, and
the subscribers see one unbroken stream. The log is parsed once, when a stream breaks: the
per-chunk path never parses JSON for this.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from streamsafe.gateway.errors import ERROR_PREFIXES
from streamsafe.gateway.generation import GenerationRequest
from streamsafe.gateway.store import EventLog
from streamsafe.sse import DONE

__all__ = [
    "Partial",
    "continuation_body",
    "is_role_chunk",
    "owed_usage",
    "read_partial",
    "tokenize_body",
    "whole_usage",
]

#: The fields of a chunk that a usage chunk owed repeats.
_STAMP = ("id", "object", "created", "model")


def is_role_chunk(payload: bytes) -> bool:
    """A chat chunk that carries only the assistant's role (and empty content): a continuation
    opens with one, which the log already has."""
    if b'"role"' not in payload:
        return False
    try:
        delta = orjson.loads(payload)["choices"][0]["delta"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return False
    return isinstance(delta, dict) and not delta.get("content") and not delta.get("tool_calls")


@dataclass(slots=True)
class Partial:
    """What a broken stream delivered: its text, content chunks, whether it had ended, whether
    a usage chunk came, and the last chunk's ``id``, ``created`` and ``model`` (a usage chunk
    owed is stamped with them)."""

    text: str
    chunks: int
    finished: bool
    usage_seen: bool = False
    stamp: dict[str, object] = field(default_factory=dict)


async def read_partial(log: EventLog) -> Partial | None:
    """The partial answer in ``log``, or ``None`` where it cannot be continued (an error event,
    tool calls, several choices, unparsable chunks)."""
    parts: list[str] = []
    chunks = 0
    finished = usage_seen = False
    stamp: dict[str, object] = {}
    for payload in await log.read(0):
        if payload == DONE or payload.startswith(ERROR_PREFIXES):
            return None
        try:
            chunk = orjson.loads(payload)
            choices = chunk.get("choices") or ()
        except (orjson.JSONDecodeError, AttributeError):
            return None
        usage_seen = usage_seen or isinstance(chunk.get("usage"), dict)
        stamp = {k: chunk[k] for k in _STAMP if k in chunk}
        for choice in choices:
            if choice.get("index", 0) != 0:
                return None
            delta = choice.get("delta") or {}
            if delta.get("tool_calls"):
                return None
            # A chat chunk's delta, or a completion chunk's text.
            content = delta.get("content") if delta else choice.get("text")
            if content:
                parts.append(content)
                chunks += 1
            finished = finished or bool(choice.get("finish_reason"))
    return Partial("".join(parts), chunks, finished, usage_seen, stamp)


def continuation_body(req: GenerationRequest, partial: Partial) -> bytes | None:
    """The request that continues a partial chat answer (vLLM's ``continue_final_message``
    with ``add_generation_prompt=false``), asking only for the tokens still owed; ``None`` for
    what cannot be continued (not a chat request, ``n`` > 1)."""
    if not req.path.endswith("/chat/completions"):
        return None
    try:
        body = orjson.loads(req.body)
    except orjson.JSONDecodeError:
        return None
    messages = body.get("messages")
    if not isinstance(messages, list) or body.get("n", 1) != 1:
        return None
    body["messages"] = [*messages, {"role": "assistant", "content": partial.text}]
    body["continue_final_message"] = True
    body["add_generation_prompt"] = False
    for name in ("max_tokens", "max_completion_tokens"):
        limit = body.get(name)
        if isinstance(limit, int):
            # vLLM streams one token per content chunk; that is the count already delivered.
            body[name] = max(1, limit - partial.chunks)
    return orjson.dumps(body)


def whole_usage(payload: bytes, tokens_before: int) -> bytes:
    """A continuation's usage chunk made to count the whole answer: its prompt held the
    ``tokens_before`` delivered earlier, which are the answer's, not the prompt's. Parsed only
    for a continued stream's usage chunk, never on the ordinary path."""
    try:
        chunk = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload
    usage = chunk.get("usage") if isinstance(chunk, dict) else None
    if not isinstance(usage, dict):
        return payload
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return payload
    usage["prompt_tokens"] = max(0, prompt - tokens_before)
    usage["completion_tokens"] = completion + tokens_before
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return orjson.dumps(chunk)


def tokenize_body(req: GenerationRequest) -> bytes | None:
    """The ``/tokenize`` request (vLLM's) that counts the prompt of ``req`` as its completion
    did, where ``req`` is a stream that asked for usage (``stream_options.include_usage``):
    a chat's messages and tools with the generation prompt, or a completion's prompt string.
    ``None`` otherwise."""
    try:
        body = orjson.loads(req.body)
    except orjson.JSONDecodeError:
        return None
    options = body.get("stream_options") if isinstance(body, dict) else None
    if not isinstance(options, dict) or options.get("include_usage") is not True:
        return None
    ask: dict[str, object] = {"model": body.get("model")}
    if req.path.endswith("/chat/completions") and isinstance(body.get("messages"), list):
        ask["messages"] = body["messages"]
        ask["add_generation_prompt"] = True
        for name in ("tools", "chat_template", "chat_template_kwargs"):
            if name in body:
                ask[name] = body[name]
    elif req.path.endswith("/completions") and isinstance(body.get("prompt"), str):
        ask["prompt"] = body["prompt"]
    else:
        return None
    return orjson.dumps(ask)


def owed_usage(partial: Partial, prompt_tokens: int) -> bytes:
    """The usage chunk a stream that asked for it still owes after the engine dropped it past
    its last token: no choices, the prompt as the engine's tokenizer counts it, one completion
    token per content chunk (vLLM streams one token per chunk; the continuation counts alike)."""
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": partial.chunks,
        "total_tokens": prompt_tokens + partial.chunks,
    }
    return orjson.dumps({**partial.stamp, "choices": [], "usage": usage})
