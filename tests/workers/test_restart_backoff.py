"""When the supervisor replaces a dead worker: at once after a lone death, waits doubling while
workers keep dying, bounded, and back to at once after a quiet window."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsafe.workers.restart import RestartBackoff

pytestmark = pytest.mark.unit

BACKOFF = RestartBackoff(first=0.5, cap=30.0, window=60.0)
times = st.lists(st.floats(min_value=0, max_value=1000, allow_nan=False), max_size=50)


def test_a_lone_death_is_replaced_at_once_and_a_crash_loop_backs_off() -> None:
    deaths: list[float] = []
    waits = []
    for t in range(10):
        deaths.append(float(t))
        waits.append(BACKOFF.delay(deaths, float(t)))
    assert waits == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_deaths_older_than_the_window_no_longer_count() -> None:
    deaths = [0.0, 1.0, 2.0, 3.0]
    assert BACKOFF.delay(deaths, 3.0) == 2.0
    assert BACKOFF.delay([*deaths, 63.5], 63.5) == 0.0
    BACKOFF.forget(deaths, 61.5)
    assert deaths == [2.0, 3.0]


@given(times, st.floats(min_value=0, max_value=2000, allow_nan=False))
def test_the_wait_is_bounded_by_the_cap(deaths: list[float], now: float) -> None:
    assert 0.0 <= BACKOFF.delay(deaths, now) <= BACKOFF.cap


@given(times, st.floats(min_value=0, max_value=1000, allow_nan=False))
def test_one_more_recent_death_never_shortens_the_wait(deaths: list[float], now: float) -> None:
    earlier = [t for t in deaths if t <= now]
    assert BACKOFF.delay([*earlier, now], now) >= BACKOFF.delay(earlier, now)


@given(times, st.floats(min_value=0, max_value=1000, allow_nan=False))
def test_forgetting_changes_no_wait(deaths: list[float], now: float) -> None:
    earlier = [t for t in deaths if t <= now]
    kept = list(earlier)
    BACKOFF.forget(kept, now)
    assert BACKOFF.delay(kept, now) == BACKOFF.delay(earlier, now)
    assert len(kept) == BACKOFF.recent(earlier, now)


def test_a_backoff_that_cannot_wait_is_refused() -> None:
    with pytest.raises(ValueError):
        RestartBackoff(first=0, cap=1)
    with pytest.raises(ValueError):
        RestartBackoff(first=2, cap=1)
