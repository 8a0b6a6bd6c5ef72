"""Shutdown goes on without what will not stop (registry.py, ``CLOSE_WAIT_S``): a process told
to stop must stop, and the log names what it left behind."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from streamsafe.gateway import registry

pytestmark = pytest.mark.timeout(30)


async def test_a_task_that_ignores_its_cancellation_is_left_behind_and_named(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(registry, "CLOSE_WAIT_S", 0.2)
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # a bug: it swallows its cancellation

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    task.cancel()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="streamsafe.gateway"):
        await registry._stopped([task], "generation task(s) cancelled")
    assert time.monotonic() - started < 5
    (record,) = [r for r in caplog.records if "shutdown:" in r.getMessage()]
    assert "1 generation task(s) cancelled still running" in record.getMessage()
    assert "test_shutdown_bound.py" in record.getMessage()  # where it waits
    release.set()
    await task


async def test_tasks_that_stop_are_waited_for_quietly(caplog: pytest.LogCaptureFixture) -> None:
    task = asyncio.create_task(asyncio.sleep(0.05))
    with caplog.at_level(logging.WARNING, logger="streamsafe.gateway"):
        await registry._stopped([task], "store bookkeeping")
    assert task.done() and not caplog.records
