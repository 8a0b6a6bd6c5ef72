"""The pure core of the SDK transport: which call a request belongs to, and which answers an SDK
may retry."""

from __future__ import annotations

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsafe.retry import Outcome, nothing_started
from streamsafe.sdk._calls import NOT_RESENT, CallBook, attempt_outcome, should_retry_header

pytestmark = pytest.mark.unit

OWNER = object()


def _headers(count: int, key: str | None = None) -> dict[str, str]:
    h = {"x-stainless-retry-count": str(count)}
    if key is not None:
        h["idempotency-key"] = key
    return h


@given(
    status=st.integers(100, 599),
    said=st.sampled_from([None, "true", "false"]),
    retry_after=st.sampled_from([None, "0", "2"]),
)
def test_only_answers_the_sdk_would_retry_and_that_may_have_started_work_are_marked(
    status: int, said: str | None, retry_after: str | None
) -> None:
    headers = {}
    if said is not None:
        headers["x-should-retry"] = said
    if retry_after is not None:
        headers["retry-after"] = retry_after
    verdict = should_retry_header(status, headers)
    sdk_retries = status in (408, 409, 429) or status >= 500
    if said is not None or not sdk_retries:
        assert verdict is None  # the server's word stands; what the SDK never retries is left
    else:
        started = not nothing_started(Outcome.status(status, headers))
        assert (verdict == "false") == started
        assert (verdict is None) == (status in (429, 503))


def _call(book: CallBook, count: int, current=None, body=b"b", key=None, owner=OWNER):
    return book.enter(owner, "POST", "u", body, _headers(count, key), current)


def test_a_retry_in_the_same_context_belongs_to_the_call_before_it() -> None:
    book = CallBook()
    first, attempt = _call(book, 0)
    assert attempt is None  # a new call: sent
    again, attempt = _call(book, 1, first)
    assert again is first and attempt is None  # nothing left running: sent again
    # Count 0 is always a new call, even with the same body (two users may want two samples).
    other, _ = _call(book, 0, first)
    assert other is not first and other.key != first.key
    # Another body, or another transport's call, is not this one's retry.
    assert _call(book, 1, first, body=b"c")[0] is not first
    assert _call(book, 1, first, owner=object())[0] is not first


def test_the_sdks_own_key_names_the_call() -> None:
    book = CallBook()
    call, _ = _call(book, 0, key="sdk-key")
    assert call.key == "sdk-key"
    assert _call(book, 1, call, key="sdk-key")[0] is call
    assert _call(book, 1, call, key="other")[0] is not call


@given(st.permutations(list(range(6))))
def test_retries_from_other_contexts_claim_each_left_attempt_once(order: list[int]) -> None:
    # Six identical calls time out; their retries arrive, in any order, from contexts that
    # do not know their call (no current call): each left attempt is claimed by one retry.
    book = CallBook()
    calls = [_call(book, 0, body=b"same")[0] for _ in range(6)]
    for i in order:
        book.left_running(calls[i], f"attempt {i}")
    taken = [_call(book, 1, body=b"same") for _ in range(6)]
    assert sorted(attempt for _, attempt in taken) == sorted(f"attempt {i}" for i in range(6))
    assert all(c.pending == attempt for c, attempt in taken)
    assert book.orphans() == 0
    # A seventh retry finds nothing left running: it is sent, as a call of its own.
    assert _call(book, 1, body=b"same")[1] is None


def test_an_expiry_after_a_retry_claimed_the_attempt_leaves_it_alone() -> None:
    book = CallBook()
    call, _ = _call(book, 0)
    turn = book.left_running(call, "attempt")
    assert _call(book, 1, call) == (call, "attempt")
    assert book.expire(call, turn) is None  # a retry waits on it
    turn = book.left_running(call, "attempt")  # the retry timed out too
    assert book.expire(call, turn) == "attempt"  # and no retry came within the grace
    assert book.orphans() == 0 and call.pending is None


def _lost(book: CallBook, exc: Exception) -> object:
    call, _ = _call(book, 0)
    book.failed(call, attempt_outcome(httpx2, exc))
    return _call(book, 1, call)[1]


def test_a_retry_of_a_request_lost_after_it_was_sent_is_not_sent() -> None:
    book = CallBook()
    assert _lost(book, httpx2.RemoteProtocolError("server disconnected")) is NOT_RESENT
    assert _lost(book, httpx2.ReadError("reset")) is NOT_RESENT
    # Where the request never left (or never arrived whole), the retry goes out.
    assert _lost(book, httpx2.ConnectError("refused")) is None
    assert _lost(book, httpx2.ConnectTimeout("slow")) is None
    assert _lost(book, httpx2.WriteError("broken pipe")) is None


def test_a_server_that_keys_its_work_gets_the_retry_of_a_lost_request() -> None:
    book = CallBook()
    book.answered("http://gw:8000/v1/chat/completions", {"x-streamsafe-generation": "g1"})
    # _call's URL is "u": another origin than the gateway's, so still refused there.
    assert _lost(book, httpx2.ReadError("reset")) is NOT_RESENT
    call, _ = book.enter(OWNER, "POST", "http://gw:8000/v1/x", b"b", _headers(0), None)
    book.failed(call, attempt_outcome(httpx2, httpx2.ReadError("reset")))
    again = book.enter(OWNER, "POST", "http://gw:8000/v1/x", b"b", _headers(1), call)
    assert again == (call, None)  # sent: the gateway attaches it by its key
