"""The statistics of the benchmarks: a seeded bootstrap interval of a median, and when the
rounds of ``bench vllm`` have settled (the ratio's interval within the tolerance of it)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsafe_bench.stats import interval, median
from streamsafe_bench.vllm_cost import _settled

pytestmark = pytest.mark.unit

_RATIOS = st.lists(st.floats(0.5, 2.0), min_size=2, max_size=30)


@settings(max_examples=100, deadline=None)
@given(_RATIOS)
def test_the_interval_holds_the_median_and_lies_within_the_values(values: list[float]) -> None:
    bounds = interval(values, random.Random(0), draws=300)
    assert bounds is not None
    mid = median(values)
    assert mid is not None
    assert min(values) <= bounds[0] <= mid <= bounds[1] <= max(values)
    assert interval(values, random.Random(0), draws=300) == bounds  # seeded: the same


def test_one_round_says_nothing_of_the_spread() -> None:
    assert interval([1.0], random.Random(0)) is None
    assert not _settled([1.0], 0.05)


def test_rounds_settle_when_they_agree_and_not_when_they_scatter() -> None:
    steady = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01]
    assert _settled(steady, 0.05)
    scattered = [0.68, 1.46, 0.99, 1.12, 0.7, 1.4]  # what a loaded 2-core machine read
    assert not _settled(scattered, 0.05)
