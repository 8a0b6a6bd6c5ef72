"""Whether an event closes a whole answer (:func:`ends_answer`), by wire format: the test that
tells a stream that ended whole from one cut short where the upstream sends no ``[DONE]``
(Llama Stack, OGX, Anthropic's Messages, the Responses API).
"""

from __future__ import annotations

from streamsafe.gateway.upstream.wire import Wire

__all__ = ["ends_answer"]

# Byte patterns, not a JSON parse: this runs on the last event of every stream. Servers write
# compact JSON (pydantic, orjson, vLLM) or json.dumps' ", " / ": " style; both are matched.
_OPENAI_FINISHED = (b'"finish_reason":"', b'"finish_reason": "')
# The Responses API's terminal events (a nested object's "type" never starts with "response.").
_RESPONSE_ENDED = tuple(
    b'"type":%s"response.%s"' % (space, end)
    for end in (b"completed", b"incomplete", b"failed")
    for space in (b"", b" ")
)
_MESSAGE_STOPPED = (b'"type":"message_stop"', b'"type": "message_stop"')
_LS_CHAT_COMPLETE = (b'"event_type":"complete"', b'"event_type": "complete"')
_LS_COMPLETION_STOPPED = (b'"stop_reason":"', b'"stop_reason": "')


def ends_answer(wire: Wire, payload: bytes) -> bool:
    """True if the event ``payload`` (an SSE ``data`` field) closes a whole answer in ``wire``:
    a ``finish_reason`` (OpenAI), ``message_stop`` (Anthropic), ``response.completed``,
    ``.incomplete`` or ``.failed`` (the Responses API), the ``complete`` event (Llama Stack
    chat), a ``stop_reason`` (Llama Stack completion). A stream that ends on any other event
    was cut short."""
    if wire is Wire.OPENAI_RESPONSES:
        patterns = _RESPONSE_ENDED
    elif wire is Wire.ANTHROPIC_MESSAGES:
        patterns = _MESSAGE_STOPPED
    elif wire is Wire.LLAMA_STACK_CHAT:
        patterns = _LS_CHAT_COMPLETE
    elif wire is Wire.LLAMA_STACK_COMPLETION:
        patterns = _LS_COMPLETION_STOPPED
    else:
        patterns = _OPENAI_FINISHED
    return any(p in payload for p in patterns)
