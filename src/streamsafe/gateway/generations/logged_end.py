"""Whether a generation's log already holds its whole answer, whatever its record says (see
docs/design.md, Replicas).

A replica that takes a generation over from a dead owner reads the log the owner wrote. The owner
may have died after the answer's end went out and before it recorded it: the log then holds a
finished answer under a record that still says it runs. Such a generation is finished, never
continued (the engine would be asked for tokens nobody is owed) nor failed (an error event and a
second ``[DONE]`` after a whole answer): an answer whose end was sent is finished.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamsafe.gateway.errors import ERROR_PREFIXES
from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.upstream.answer_end import ends_answer
from streamsafe.sse import DONE

__all__ = ["LoggedEnd", "logged_end"]


@dataclass(frozen=True, slots=True)
class LoggedEnd:
    """How a generation whose log holds its whole answer ended: ``state``, and the events its
    log still owes (the ``[DONE]`` the gateway appends after a Llama Stack stream's last
    event)."""

    state: State
    owed: tuple[bytes, ...] = ()


def logged_end(gen: Generation, tail: list[bytes]) -> LoggedEnd | None:
    """How ``gen`` ended if its log, whose last events are ``tail`` (two are enough), holds its
    whole answer; ``None`` where the answer is not whole (it is continued or failed as a broken
    stream is). A plain call's log holds its answer once it holds anything; a stream's once it
    ends with ``[DONE]`` (failed where an error event comes just before it), or, on a wire whose
    upstream sends no ``[DONE]`` (Llama Stack), with the event that closes an answer. A stream
    whose last chunk carries a ``finish_reason`` but no ``[DONE]`` yet is left to the relay,
    which owes it only its end (``[DONE]``, and the usage chunk its request asked for)."""
    if not tail:
        return None
    if not gen.stream:
        return LoggedEnd(State.DONE)
    last = tail[-1]
    if last == DONE:
        errored = len(tail) > 1 and tail[-2].startswith(ERROR_PREFIXES)
        return LoggedEnd(State.FAILED if errored else State.DONE)
    route = gen.request.route
    if not route.upstream_done:
        if last.startswith(ERROR_PREFIXES):
            return LoggedEnd(State.FAILED, (DONE,))
        if ends_answer(route.wire, last):
            return LoggedEnd(State.DONE, (DONE,))
    return None
