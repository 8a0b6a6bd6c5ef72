"""A recorded chat-completion stream, the same bytes for every codec and client benchmark.

The chunks have the shape vLLM sends (``chat.completion.chunk`` with ``id``, ``created``,
``model``, ``choices[{index, delta, logprobs, finish_reason}]``), one event per network read, as
vLLM flushes each token; ``coalesce`` packs several events into one read, as a proxy or a slow
reader sees them.
"""

from __future__ import annotations

import orjson

__all__ = ["recorded_chat_events", "recorded_chat_stream"]

_WORDS = ("the", " engine", " streams", " tokens", " while", " a", " client", " waits", ",", ".")


def recorded_chat_events(n_chunks: int = 10_000, *, with_ids: bool = False) -> list[bytes]:
    """``n_chunks`` encoded SSE events (role chunk, content chunks, a final chunk), then
    ``data: [DONE]``. With ``with_ids``, each event carries ``id: n`` as the gateway sends it."""
    base = {
        "id": "chatcmpl-3f1c2d9a8b7e4c6d",
        "object": "chat.completion.chunk",
        "created": 1_764_700_000,
        "model": "sim-llama-8b",
    }
    events = []
    for i in range(n_chunks):
        if i == 0:
            delta: dict[str, str] = {"role": "assistant", "content": ""}
        else:
            delta = {"content": _WORDS[i % len(_WORDS)]}
        finish = "length" if i == n_chunks - 1 else None
        chunk = dict(
            base, choices=[{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        )
        prefix = b"id: %d\n" % i if with_ids else b""
        events.append(prefix + b"data: " + orjson.dumps(chunk) + b"\n\n")
    events.append((b"id: %d\n" % n_chunks if with_ids else b"") + b"data: [DONE]\n\n")
    return events


def recorded_chat_stream(
    n_chunks: int = 10_000, *, coalesce: int = 1, with_ids: bool = False
) -> list[bytes]:
    """The recorded stream as network reads of ``coalesce`` events each (``with_ids``: framed
    as the gateway sends it, ``id: n`` on every event)."""
    events = recorded_chat_events(n_chunks, with_ids=with_ids)
    if coalesce <= 1:
        return events
    return [b"".join(events[i : i + coalesce]) for i in range(0, len(events), coalesce)]
