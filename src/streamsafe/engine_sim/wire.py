"""The bytes the simulator writes, shaped as vLLM's OpenAI server writes them.

Streams: ``data: <json>\\n\\n`` events with no ``id:`` lines; a chat stream opens with a delta of
``{"role": "assistant", "content": ""}`` (sent with the first token, after prefill, as vLLM does);
each token is one event; the last token's event carries ``finish_reason``; with
``stream_options.include_usage`` a chunk with empty ``choices`` and ``usage`` follows; then
``data: [DONE]``. Keys absent from vLLM's output for these requests (``usage`` on ordinary chunks)
are absent here too.

Per-token work is a byte join of a pre-encoded head, the word and a pre-encoded tail, framed by
:func:`streamsafe.sse.encode_event`: no JSON encoding per token.
"""

from __future__ import annotations

import json

import orjson

from streamsafe.sse import DONE_EVENT, encode_event

__all__ = ["DONE_EVENT", "ChunkEncoder", "error_body"]

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "RequestEntityTooLargeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


def error_type(code: int) -> str:
    """The ``type`` vLLM gives an error of this status."""
    return _TYPES.get(code, "InternalServerError" if code >= 500 else "BadRequestError")


def error_object(message: str, code: int, name: str | None = None) -> dict[str, object]:
    """``{"error": {"message", "type", "param", "code"}}``: the OpenAI error shape; ``code`` is
    the status, or ``name`` where the error has one (``invalid_prefill``)."""
    error = {"message": message, "type": error_type(code), "param": None, "code": name or code}
    return {"error": error}


def error_body(message: str, code: int, name: str | None = None) -> bytes:
    """:func:`error_object` as JSON bytes."""
    return orjson.dumps(error_object(message, code, name))


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The ``usage`` object, keys in vLLM's order."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


class ChunkEncoder:
    """Pre-encoded pieces of one response's stream chunks (chat or completion)."""

    __slots__ = ("_base", "_head", "_tail", "_tail_last", "chat", "created", "id", "model")

    def __init__(self, *, chat: bool, request_id: str, created: int, model: str) -> None:
        self.chat = chat
        self.id = request_id
        self.created = created
        self.model = model
        obj = b"chat.completion.chunk" if chat else b"text_completion"
        self._base = (
            b'{"id":'
            + orjson.dumps(request_id)
            + b',"object":"'
            + obj
            + b'","created":'
            + str(created).encode()
            + b',"model":'
            + orjson.dumps(model)
        )
        if chat:
            self._head = self._base + b',"choices":[{"index":0,"delta":{"content":"'
            self._tail = b'"},"logprobs":null,"finish_reason":null}]}'
            self._tail_last = b'"},"logprobs":null,"finish_reason":"length","stop_reason":null}]}'
        else:
            self._head = self._base + b',"choices":[{"index":0,"text":"'
            self._tail = b'","logprobs":null,"finish_reason":null,"stop_reason":null}]}'
            self._tail_last = b'","logprobs":null,"finish_reason":"length","stop_reason":null}]}'

    def role(self) -> bytes:
        """The chat stream's opening event."""
        return encode_event(
            self._base + b',"choices":[{"index":0,"delta":{"role":"assistant",'
            b'"content":""},"logprobs":null,"finish_reason":null}]}'
        )

    def token(self, word: bytes, last: bool) -> bytes:
        """One token's event; ``last`` carries ``finish_reason: "length"``."""
        return encode_event(b"".join((self._head, word, self._tail_last if last else self._tail)))

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The ``include_usage`` event: empty choices and the usage object."""
        return encode_event(
            self._base
            + b',"choices":[],"usage":'
            + orjson.dumps(usage(prompt_tokens, completion_tokens))
            + b"}"
        )

    def complete(self, text: str, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The whole non-streaming response body."""
        finish = "length"
        choice: dict[str, object]
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        return orjson.dumps(
            {
                "id": self.id,
                "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [choice],
                "usage": usage(prompt_tokens, completion_tokens),
            }
        )


def error_event(message: str, code: int = 500) -> bytes:
    """A mid-stream error event (vLLM's shape when the engine dies under a stream)."""
    body = {"error": {"message": message, "type": error_type(code), "code": code}}
    # vLLM writes this event with json.dumps, spaces after separators included.
    return encode_event(json.dumps(body).encode())
