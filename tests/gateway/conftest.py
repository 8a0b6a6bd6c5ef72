"""Gateway test fixtures. The helpers live in gateway_helpers.py (importable because this folder
is put on sys.path here; pytest runs with --import-mode=importlib)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))


from gateway_helpers import Stack, make_stack


@pytest.fixture
def stack() -> Iterator[Stack]:
    with make_stack() as s:
        yield s
