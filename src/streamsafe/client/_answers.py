"""What a server's answer holds, read without I/O: an error body, whether a 2xx answer is an
event stream, the text of stream chunks and whether they finished. Shared by a call's attempts
(``_call``) and the clients that send them (``_async``, and ``_sync`` generated from it)."""

from __future__ import annotations

from typing import Any

import httpx2
import orjson

from streamsafe.client.types import APIObject

__all__ = [
    "RESPONSE_ENDS",
    "finished",
    "is_event_stream",
    "not_an_object",
    "parse_error_body",
    "text_of",
]


def parse_error_body(raw: bytes) -> Any:
    """An error body as JSON where it is JSON, else as text."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")


def is_event_stream(response: httpx2.Response) -> bool:
    """Whether a 2xx answer to a streaming request is an event stream. A missing
    ``Content-Type`` is given the benefit of the doubt (the SSE decoder will tell)."""
    ctype = response.headers.get("content-type")
    return ctype is None or ctype.lstrip().lower().startswith("text/event-stream")


#: The events that end a Responses API stream (which sends no ``[DONE]``).
RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def text_of(chunks: list[Any]) -> str:
    """The text of choice 0 across stream chunks (chat ``delta.content`` or completion
    ``text``; a Responses API stream's ``output_text`` deltas): what a caller shows."""
    parts: list[str] = []
    for chunk in chunks:
        data = _data(chunk)
        if data.get("type") == "response.output_text.delta":
            piece = data.get("delta")
            if isinstance(piece, str):
                parts.append(piece)
            continue
        for choice in _choices(chunk):
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if piece and isinstance(piece, str):
                parts.append(piece)
    return "".join(parts)


def finished(chunks: list[Any]) -> bool:
    """Whether the stream reported a ``finish_reason`` (the last chunk with choices has one),
    or, for a Responses API stream, ended with its closing event: a stream that ends cleanly
    after it lost nothing but ``[DONE]`` (which the Responses API never sends)."""
    if chunks and _data(chunks[-1]).get("type") in RESPONSE_ENDS:
        return True
    for chunk in reversed(chunks):
        choices = _choices(chunk)
        if choices:
            return any(c.get("finish_reason") for c in choices)
    return False


def not_an_object(raw: bytes) -> str:
    """Why a stream event that is no JSON object cannot be read: what its error says."""
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "not JSON"
    return "not a JSON object"


def _data(chunk: Any) -> dict[str, Any]:
    data = chunk.to_dict() if isinstance(chunk, APIObject) else chunk
    return data if isinstance(data, dict) else {}


def _choices(chunk: Any) -> list[dict[str, Any]]:
    # A server may send anything as "choices"; what is not a list of objects has no text.
    choices = _data(chunk).get("choices")
    if type(choices) is not list:
        return []
    return [c for c in choices if type(c) is dict]
