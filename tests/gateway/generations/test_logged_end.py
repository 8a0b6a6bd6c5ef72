"""Whether a log taken over from a dead replica already holds its whole answer (issue 30): an
answer whose end was sent is finished, whatever the record says; one that was not is left to
the relay to continue or fail."""

from __future__ import annotations

import pytest

from streamsafe.gateway.generations.generation import Generation, State
from streamsafe.gateway.generations.logged_end import LoggedEnd, logged_end
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.generations.store import MemoryEventLog
from streamsafe.gateway.upstream.kinds import KINDS, CompletionRoute, Wire

pytestmark = pytest.mark.unit

#: vLLM's chat route: its streams end with [DONE].
CHAT = KINDS["vllm"].route("/v1/chat/completions")

LS_CHAT = CompletionRoute(
    "/v1/inference/chat-completion",
    "/v1/inference/chat-completion",
    Wire.LLAMA_STACK_CHAT,
    False,
    False,
    preamble=1,
)
TOKEN = b'{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}'
FINISH = b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}'
ERROR = b'{"error":{"message":"engine died","code":500}}'
LS_TOKEN = b'{"event":{"event_type":"progress","delta":{"type":"text","text":"a"}}}'
LS_COMPLETE = b'{"event":{"event_type":"complete","delta":{"type":"text","text":""}}}'


def _gen(stream: bool = True, route: CompletionRoute = CHAT) -> Generation:
    req = GenerationRequest("t", "/v1/chat/completions", b"{}", b"fp", 1, stream, route=route)
    return Generation("gen-1", req, MemoryEventLog(), None, 0.0)


@pytest.mark.parametrize(
    ("stream", "route", "tail", "end"),
    [
        (True, CHAT, [FINISH, b"[DONE]"], LoggedEnd(State.DONE)),
        (True, CHAT, [ERROR, b"[DONE]"], LoggedEnd(State.FAILED)),
        (True, CHAT, [b"[DONE]"], LoggedEnd(State.DONE)),
        (False, CHAT, [b'{"choices":[]}'], LoggedEnd(State.DONE)),
        (True, LS_CHAT, [LS_TOKEN, LS_COMPLETE], LoggedEnd(State.DONE, (b"[DONE]",))),
        (True, LS_CHAT, [LS_TOKEN, ERROR], LoggedEnd(State.FAILED, (b"[DONE]",))),
        (True, LS_CHAT, [LS_COMPLETE, b"[DONE]"], LoggedEnd(State.DONE)),
    ],
)
def test_a_log_that_holds_its_answer_s_end_is_finished(
    stream: bool, route: CompletionRoute, tail: list[bytes], end: LoggedEnd
) -> None:
    assert logged_end(_gen(stream, route), tail) == end


@pytest.mark.parametrize(
    ("route", "tail"),
    [
        (CHAT, []),
        (CHAT, [TOKEN, TOKEN]),  # cut mid-answer: continued
        (CHAT, [TOKEN, FINISH]),  # only the end missing: the relay owes [DONE] and the usage
        (CHAT, [TOKEN, ERROR]),  # an error with no [DONE]: the relay ends it as it would
        (LS_CHAT, [LS_TOKEN, LS_TOKEN]),
    ],
)
def test_a_log_cut_before_its_answer_s_end_is_left_to_the_relay(
    route: CompletionRoute, tail: list[bytes]
) -> None:
    assert logged_end(_gen(True, route), tail) is None


def test_a_plain_call_with_nothing_logged_is_not_finished() -> None:
    assert logged_end(_gen(False), []) is None
