"""Refusals in the shape of Anthropic's Messages API, for its routes (``/v1/messages``,
``/v1/messages/count_tokens``): the Anthropic SDK reads ``{"type": "error", "error": {"type",
"message"}}`` into its own error classes by status, and Anthropic's "overloaded" is 529
(``overloaded_error``), where the gateway and vLLM say 503. ``Retry-After`` and the other
headers stay as they were.

A thin wrapper of ``send`` on those routes alone: every other route's answers, and every body
of a stream, pass as they were written (an error after commit is framed by the route's
:mod:`~streamsafe.gateway.generations.framing`).
"""

from __future__ import annotations

import orjson

from streamsafe.gateway.generations.framing import anthropic_error
from streamsafe.server.asgi import Message, Send

__all__ = ["MESSAGES_PATHS", "anthropic_errors", "anthropic_status"]

#: The Messages API's routes (what the gateway serves of Anthropic's API).
MESSAGES_PATHS = ("/v1/messages", "/v1/messages/count_tokens")


def anthropic_status(status: int) -> int:
    """The status Anthropic's API gives for the gateway's ``status``: 529 for 503."""
    return 529 if status == 503 else status


def _anthropic_body(status: int, body: bytes) -> bytes:
    """An error ``body`` (OpenAI's shape, vLLM's flat one, or Anthropic's already) in
    Anthropic's shape."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return anthropic_error(status, body[:1000].decode("utf-8", "replace"))
    if not isinstance(doc, dict) or doc.get("type") == "error":
        return body
    error = doc.get("error")
    if isinstance(error, dict):
        message = error.get("message")
    elif isinstance(error, str):
        message = error
    else:
        message = doc.get("message") or doc.get("detail")
    return anthropic_error(status, str(message if message is not None else body[:1000]))


def anthropic_errors(send: Send) -> Send:
    """``send`` that writes an error answer (status >= 400, its body in one message) in
    Anthropic's shape and status; everything else as it comes."""
    held: Message | None = None

    async def send_(message: Message) -> None:
        nonlocal held
        if message["type"] == "http.response.start" and message["status"] >= 400:
            held = message
            return
        if held is None or message["type"] != "http.response.body":
            await send(message)
            return
        start, held = held, None
        status = start["status"]
        headers = list(start.get("headers", ()))
        body = message.get("body", b"")
        if not message.get("more_body", False):
            body = _anthropic_body(status, body)
            headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
            headers.append((b"content-length", b"%d" % len(body)))
        await send({**start, "status": anthropic_status(status), "headers": headers})
        await send({**message, "body": body})

    return send_
