"""``--workers``: a count or ``auto``; what a supervisor tells a worker comes back whole."""

from __future__ import annotations

import argparse
import os
import socket

import pytest

from streamsafe.workers.cli import cores, worker_count
from streamsafe.workers.worker import this_worker, worker_env

pytestmark = pytest.mark.unit


def test_workers_takes_a_count_or_auto() -> None:
    assert worker_count("3") == 3
    assert worker_count("auto") == worker_count("AUTO") == cores() >= 1
    for wrong in ("0", "-2", "two", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            worker_count(wrong)


def test_a_process_no_supervisor_started_is_no_worker() -> None:
    assert this_worker({}) is None


def test_a_worker_reads_back_what_its_supervisor_gave() -> None:
    with socket.socket() as listening:
        fd = os.dup(listening.fileno())
        env = worker_env(fd, 2, redis="unix:///tmp/x/redis.sock", upstream="http://e:1")
        assert "STREAMSAFE_REDIS_SECRET" not in env
        # This process plays the worker; the kernel is not asked to stop it with its parent
        # (what a real worker asks for is tested with the processes, tests/fleet).
        assert env.pop("STREAMSAFE_WORKER_PARENT") == str(os.getpid())
        place = this_worker(env)
        assert place is not None
        with place.sock:
            assert place.sock.fileno() == fd
            assert (place.index, place.redis, place.upstream) == (
                2,
                "unix:///tmp/x/redis.sock",
                "http://e:1",
            )
    assert worker_env(3, 1, secret="s")["STREAMSAFE_REDIS_SECRET"] == "s"
