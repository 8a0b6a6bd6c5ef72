"""The body formats of the completion routes the gateway serves (:class:`Wire`): OpenAI's chat,
completion and Responses API, vLLM's pooling requests, Anthropic's Messages API, Llama Stack's
native chat and completion."""

from __future__ import annotations

import enum

__all__ = ["ANTHROPIC_ERROR_PREFIXES", "Wire"]

#: How an error event of Anthropic's Messages stream starts (``{"type": "error", "error":
#: {...}}``), as vLLM (pydantic) and json.dumps write it.
ANTHROPIC_ERROR_PREFIXES = (b'{"type":"error"', b'{"type": "error"')


class Wire(enum.Enum):
    """The body format of a completion route (requests, chunks and whole answers)."""

    OPENAI_CHAT = "openai-chat"
    """``chat.completion`` / ``chat.completion.chunk`` (``choices[].delta.content``)."""

    OPENAI_COMPLETION = "openai-completion"
    """``text_completion`` (``choices[].text``)."""

    OPENAI_RESPONSES = "openai-responses"
    """The Responses API: ``input`` (a string or items) in; a ``response`` object out, or a
    stream of typed events (``response.created`` ... ``response.output_text.delta`` ...
    ``response.completed``), each with its ``sequence_number``."""

    OPENAI_POOLING = "openai-pooling"
    """A pooling request (vLLM's embeddings, pooling, classify, score, rerank): texts or token
    ids in, one JSON answer out, never streamed; ``model`` may be left out (the engine's
    one)."""
    ANTHROPIC_MESSAGES = "anthropic-messages"
    """Anthropic's Messages API (vLLM serves it): ``messages``, ``system`` and ``max_tokens``
    in; a ``message`` out, or a stream of named events (``message_start``,
    ``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``, ``message_stop``) whose
    ``data`` names its event in ``type``, with no ``[DONE]``."""

    LLAMA_STACK_CHAT = "llama-stack-chat"
    """Llama Stack's native chat: ``{"event": {"event_type", "delta": {"text"}, ...}}`` chunks,
    ``{"completion_message": {...}}`` whole answers; the request names ``model_id``."""

    LLAMA_STACK_COMPLETION = "llama-stack-completion"
    """Llama Stack's native completion: ``{"delta", "stop_reason"}`` chunks, ``{"content",
    "stop_reason"}`` whole answers; the request names ``model_id`` and ``content``."""

    @property
    def is_chat(self) -> bool:
        """True for the chat formats (messages in, a message out)."""
        return self in (Wire.OPENAI_CHAT, Wire.LLAMA_STACK_CHAT)

    @property
    def model_field(self) -> str:
        """The request field that names the model."""
        return "model_id" if self in _NATIVE else "model"


_NATIVE = frozenset((Wire.LLAMA_STACK_CHAT, Wire.LLAMA_STACK_COMPLETION))
