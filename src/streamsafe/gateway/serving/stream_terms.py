"""The terms a subscriber's stream is served under (:class:`StreamTerms`), and how it ends under
them: its last events and the end in one write, a failure as its real status before commit or as
an error event after it (then a reset where the terms ask), or, before any commit, a 429 that
tells a queued caller to come back (:func:`send_step_back`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from streamsafe.gateway.admission.admission import Admission, retry_after_seconds
from streamsafe.gateway.errors import Failure, error_body, send_failure
from streamsafe.gateway.generations.framing import OPENAI, Framing
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.serving.pacing import StreamRules
from streamsafe.server.asgi import BodyWriter, Message, Send, respond
from streamsafe.sse import DONE_EVENT

__all__ = ["StreamTerms", "end_stream", "send_step_back"]


@dataclass(frozen=True, slots=True)
class StreamTerms:
    """How a subscriber's stream is served, beyond its generation and where it starts.

    ``rules``: when it commits and heartbeats. ``admission``: predicts a queued generation's
    wait, and is told of a commit or a refusal before it. ``drop_done`` leaves out ``data:
    [DONE]`` (Llama Stack's streams end without it). ``reset_on_failure``: how to end a stream
    whose generation failed after commit instead of closing it cleanly (a reset, for clients
    that would read a clean end as a complete answer). The first ``preamble`` events come before
    the first token (Llama Stack's ``start`` event), so heartbeats go on past them. ``writer``:
    the server's direct body writer, with which a subscriber that keeps up is served from the
    relay's read callback (:mod:`streamsafe.gateway.generations.fanout`). ``framing``: how
    events, heartbeats and a failure after commit are written (Anthropic's Messages API names
    its events, see :mod:`streamsafe.gateway.generations.framing`).
    """

    rules: StreamRules
    admission: Admission
    drop_done: bool = False
    reset_on_failure: Callable[[], None] | None = None
    preamble: int = 0
    writer: BodyWriter | None = None
    framing: Framing = OPENAI


async def send_step_back(send: Send, retry_after: float) -> None:
    """429 to a client that would time out before its place comes; the place is kept for its
    return. ``retry-after-ms`` (read by Stainless clients and streamsafe's) says it precisely."""
    msg = f"gateway at capacity; your place is kept: retry after {retry_after:.3g} s"
    headers = [
        (b"retry-after", str(retry_after_seconds(retry_after, 1.0)).encode()),
        (b"retry-after-ms", str(max(1, round(retry_after * 1000))).encode()),
    ]
    await respond(send, 429, error_body(msg, "rate_limit_error", 429), headers=headers)


async def end_stream(
    gen: Generation,
    send: Send,
    start_msg: Message,
    committed: bool,
    terms: StreamTerms,
    last: bytes = b"",
    past: Failure | None = None,
) -> None:
    """Every event went out (but ``last``, the framed final events, sent with the end) and
    ``gen`` finished: close the stream. A failure before anything was committed keeps its real
    status; after commit it becomes an error event (vLLM's way), and the stream ends with
    ``terms.reset_on_failure`` where one is given. ``past``: the subscriber resumed from past the
    end, which is its failure whatever the generation's."""
    failure = past or gen.failure
    if not committed:
        if failure is not None:
            await send_failure(send, failure)
            return
        await send(start_msg)
    failed = past is not None or gen.state is State.FAILED
    reset = terms.reset_on_failure if failed else None
    tail = last
    if failure is not None:
        tail += terms.framing.error(failure)
        if not terms.drop_done:
            tail += DONE_EVENT
    if reset is None:
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        return
    if tail:
        await send({"type": "http.response.body", "body": tail, "more_body": True})
    reset()
