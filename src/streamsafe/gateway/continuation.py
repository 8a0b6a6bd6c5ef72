"""Continuing a chat stream whose upstream connection broke (see docs/design.md, Continuation).

When the stream from the engine ends with no error and no ``[DONE]`` (a proxy or the connection
died), the engine aborted its copy when the connection closed. Asking it to continue the partial
answer (vLLM's ``continue_final_message``) for the tokens still owed generates nothing twice, and
the subscribers see one unbroken stream. The log is parsed once, when a stream breaks: the
per-chunk path never parses JSON for this.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from streamsafe.gateway.errors import ERROR_PREFIXES
from streamsafe.gateway.generation import GenerationRequest
from streamsafe.gateway.store import EventLog
from streamsafe.sse import DONE

__all__ = ["Partial", "continuation_body", "is_role_chunk", "read_partial", "whole_usage"]


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
    """What a broken stream delivered: its text, content chunks and whether it had ended."""

    text: str
    chunks: int
    finished: bool


async def read_partial(log: EventLog) -> Partial | None:
    """The partial answer in ``log``, or ``None`` where it cannot be continued (an error event,
    tool calls, several choices, unparsable chunks)."""
    parts: list[str] = []
    chunks = 0
    finished = False
    for payload in await log.read(0):
        if payload == DONE or payload.startswith(ERROR_PREFIXES):
            return None
        try:
            choices = orjson.loads(payload).get("choices") or ()
        except (orjson.JSONDecodeError, AttributeError):
            return None
        for choice in choices:
            if choice.get("index", 0) != 0:
                return None
            delta = choice.get("delta") or {}
            if delta.get("tool_calls"):
                return None
            content = delta.get("content")
            if content:
                parts.append(content)
                chunks += 1
            finished = finished or bool(choice.get("finish_reason"))
    return Partial("".join(parts), chunks, finished)


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
