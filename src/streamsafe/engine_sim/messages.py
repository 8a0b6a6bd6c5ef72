"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) as vLLM 0.32
serves it: the request is read as the chat it stands for, and the chat's answer is written back
in Anthropic's shapes (vLLM's ``entrypoints/anthropic/serving.py`` does the same over its chat
server).

- The request: ``model``, ``messages`` (string or text-block content) and ``max_tokens`` are
  required; ``system`` (a string or text blocks) becomes the first message; ``temperature``,
  ``top_p``, ``top_k`` carry over; ``stream`` asks for usage on the way, as vLLM does. A trailing
  assistant message is one more message, not a prefill: vLLM renders it with the generation
  prompt after it (``add_generation_prompt`` stays on; a request cannot turn it off).
- A stream: ``event: message_start`` (usage: the prompt), ``content_block_start`` (index 0, a
  text block) with the first token, one ``content_block_delta`` (``text_delta``) per token,
  ``content_block_stop``, ``message_delta`` (``stop_reason``, usage: prompt and output tokens),
  ``message_stop``. No ``ping``: vLLM sends none. A failure under the stream is an ``event:
  error`` (``internal_error``).
- A whole answer: ``{"id", "type": "message", "role": "assistant", "content": [text block],
  "model", "stop_reason", "stop_sequence", "usage"}``.
- Errors keep their status, in Anthropic's shape ``{"type": "error", "error": {"type",
  "message"}}`` with vLLM's error type names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from streamsafe.engine_sim.validation import BadRequest
from streamsafe.server.asgi import Message, Send
from streamsafe.sse import DONE, SSEDecoder

__all__ = ["MessagesWriter", "count_tokens_body", "to_chat"]

_STOP_REASONS = {"length": "max_tokens", "stop": "end_turn"}


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content blocks")
    parts = []
    for j, block in enumerate(content):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise BadRequest(f"{where}[{j}] must be an object with a 'type'")
        if block["type"] == "text":
            if not isinstance(block.get("text"), str):
                raise BadRequest(f"{where}[{j}].text must be a string")
            parts.append(block["text"])
    return "".join(parts)


def to_chat(body: Any, *, count_only: bool = False) -> dict[str, Any]:
    """The chat request a Messages request ``body`` stands for (vLLM's conversion, text
    only); raises :class:`BadRequest` where vLLM's model refuses it (400)."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    for name in ("model", "messages") if count_only else ("model", "messages", "max_tokens"):
        if name not in body:
            raise BadRequest(f"Field required: {name}")
    given = body["messages"]
    if not isinstance(given, list):
        raise BadRequest("'messages' must be a list")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text(system, "system")})
    for i, msg in enumerate(given):
        if not isinstance(msg, Mapping) or msg.get("role") not in ("user", "assistant", "system"):
            raise BadRequest(f"messages[{i}] must be an object with a role user or assistant")
        messages.append(
            {"role": msg["role"], "content": _text(msg.get("content"), f"messages[{i}]")}
        )
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    if not count_only:
        chat["max_tokens"] = body["max_tokens"]
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            chat[name] = body[name]
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean")
    if stream and not count_only:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def count_tokens_body(prompt_tokens: int) -> bytes:
    """``/v1/messages/count_tokens``'s answer."""
    return orjson.dumps(
        {
            "input_tokens": prompt_tokens,
            "context_management": {"original_input_tokens": prompt_tokens},
        }
    )


def _event(name: bytes, obj: object) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (name, orjson.dumps(obj))


def _error(status: int, body: bytes) -> bytes:
    """An OpenAI error body in Anthropic's shape (vLLM's ``translate_error_response``)."""
    try:
        error = orjson.loads(body)["error"]
        kind, message = str(error.get("type")), str(error.get("message"))
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        kind, message = "InternalServerError", body.decode("utf-8", "replace")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


class MessagesWriter:
    """``send`` for a chat answer that writes it as Anthropic's Messages API: :meth:`send`
    takes the chat's ASGI messages (a stream, a whole answer or an error) and sends their
    Messages form. ``prompt_tokens``: the prompt, for ``message_start``'s usage."""

    __slots__ = ("_decoder", "_finish", "_open", "_send", "_status", "prompt_tokens")

    def __init__(self, send: Send, prompt_tokens: int) -> None:
        self._send = send
        #: The prompt's tokens, for the usage of ``message_start`` (known once validated).
        self.prompt_tokens = prompt_tokens
        self._decoder = SSEDecoder()
        self._status = 200
        self._open = False  # the text block started
        self._finish = "length"

    async def send(self, message: Message) -> None:
        """Send ``message``'s Messages form."""
        if message["type"] == "http.response.start":
            self._status = message["status"]
            headers = [(k, v) for k, v in message.get("headers", ()) if k != b"content-length"]
            await self._send({**message, "headers": headers})
            return
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        body: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        if self._status != 200:
            body = _error(self._status, body) if body else body
        elif body.startswith(b"{"):
            body = self._whole(body)
        elif body:
            body = b"".join(self._stream_event(e.raw) for e in self._decoder.feed(body))
        await self._send({"type": "http.response.body", "body": body, "more_body": more})

    def _whole(self, body: bytes) -> bytes:
        chat = orjson.loads(body)
        choice = chat["choices"][0]
        usage = chat.get("usage") or {}
        return orjson.dumps(
            {
                "id": chat["id"],
                "type": "message",
                "role": "assistant",
                "content": [{"type": "text", "text": choice["message"].get("content") or ""}],
                "model": chat["model"],
                "stop_reason": _STOP_REASONS.get(choice.get("finish_reason"), "end_turn"),
                "stop_sequence": None,
                "usage": {
                    "input_tokens": usage.get("prompt_tokens", 0),
                    "output_tokens": usage.get("completion_tokens", 0),
                },
            }
        )

    def _stream_event(self, payload: bytes) -> bytes:
        if payload == DONE:
            return _event(b"message_stop", {"type": "message_stop"})
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return b"data: %s\n\n" % payload  # the malformed fault, relayed as it is
        if "error" in chunk:
            error = {"type": "internal_error", "message": str(chunk["error"].get("message"))}
            return _event(b"error", {"type": "error", "error": error})
        choices = chunk.get("choices")
        if not choices:  # the usage chunk: the block and the message end
            usage = chunk.get("usage") or {}
            out = b""
            if self._open:
                out += _event(b"content_block_stop", {"type": "content_block_stop", "index": 0})
                self._open = False
            delta = {
                "stop_reason": _STOP_REASONS.get(self._finish, "end_turn"),
                "stop_sequence": None,
            }
            usage = {
                "input_tokens": usage.get("prompt_tokens", self.prompt_tokens),
                "output_tokens": usage.get("completion_tokens", 0),
            }
            return out + _event(
                b"message_delta", {"type": "message_delta", "delta": delta, "usage": usage}
            )
        choice = choices[0]
        delta = choice.get("delta") or {}
        self._finish = choice.get("finish_reason") or self._finish
        if "role" in delta:
            message = {
                "id": chunk["id"],
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": chunk["model"],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
            }
            return _event(b"message_start", {"type": "message_start", "message": message})
        text = delta.get("content")
        if not text:
            return b""
        out = b""
        if not self._open:
            self._open = True
            block = {"type": "text", "text": ""}
            out = _event(
                b"content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": block},
            )
        text_delta = {"type": "text_delta", "text": text}
        return out + _event(
            b"content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": text_delta},
        )
