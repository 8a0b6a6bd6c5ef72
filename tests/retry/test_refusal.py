"""An error a server sent in-band before any token is a refusal only where it says so."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsafe.retry import REFUSAL_STATUSES, Outcome, nothing_started, refusal_status

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("error", "status"),
    [
        # vLLM 0.32's load shedding, as its serving layer writes it.
        ({"message": "busy", "type": "Service Unavailable", "param": None, "code": 503}, 503),
        ({"message": "slow down", "code": 429}, 429),
        ({"message": "slow down", "code": "429"}, 429),
        ({"message": "m", "type": "rate_limit_exceeded"}, 429),
        ({"message": "m", "code": "rate_limit_exceeded"}, 429),
        ({"message": "m", "type": "overloaded_error"}, 503),
        ({"message": "boom", "type": "InternalServerError", "code": 500}, None),
        ({"message": "bad", "type": "BadRequestError", "code": 400}, None),
        ({"message": "503 in the text is not a code"}, None),
        ("a string", None),
        (None, None),
    ],
)
def test_refusal_status_reads_the_code_then_the_words(error: object, status: int | None) -> None:
    assert refusal_status(error) == status


@given(
    code=st.integers(100, 599).filter(lambda c: c not in REFUSAL_STATUSES),
    kind=st.sampled_from(["InternalServerError", "BadRequestError", "server_error", None]),
)
def test_any_other_error_is_a_failure(code: int, kind: str | None) -> None:
    assert refusal_status({"message": "m", "type": kind, "code": code}) is None


def test_a_refusal_in_band_is_an_uncommitted_status_so_nothing_started() -> None:
    outcome = Outcome.refused_in_band(503, {"Retry-After": "2"})
    assert not outcome.committed and outcome.status_code == 503
    assert outcome.header("retry-after") == "2"
    assert nothing_started(outcome)
    assert outcome.describe() == "refused by its first event (503)"
