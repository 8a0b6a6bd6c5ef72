"""Real servers for the fleet tests: ``redis-server`` and ``streamsafe`` processes (from
:mod:`streamsafe.bench.processes`). When ``redis-server`` is missing, tests that need it fail in
CI (the ``CI`` environment variable is set) and are skipped elsewhere; Debian and Ubuntu ship it
as the package ``redis-server``."""

from __future__ import annotations

import os
import shutil

import pytest

from streamsafe.bench.processes import RedisServer as RedisProcess
from streamsafe.bench.processes import ServerProcess as Process

__all__ = ["Process", "RedisProcess", "redis_binary"]


def redis_binary() -> str:
    """The redis-server binary, or fail (CI) / skip (elsewhere) the test that needs it."""
    found = shutil.which("redis-server")
    if found is None:
        msg = "redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return found
