"""Suite-wide fixtures: the servers tests hand to ``server_stops.stop_later`` are all stopped
before the session ends."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

# Last on the path, so a folder's own helpers and conftest (put first by its conftest) win.
sys.path.append(os.path.dirname(__file__))

from server_stops import wait_stopped


@pytest.fixture(scope="session", autouse=True)
def _servers_stopped_at_the_end() -> Iterator[None]:
    yield
    wait_stopped()
