"""The synchronous client is generated from the asynchronous one, and the check that keeps
them equal (run by ``make lint``) fails on any drift."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync_script", ROOT / "scripts/unasync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.integration
def test_sync_client_is_exactly_what_the_async_source_generates():
    unasync = _script()
    [(src, dst)] = unasync.PAIRS
    assert unasync.generate(src, dst) == dst.read_text()


@pytest.mark.integration
def test_drift_check_fails_on_a_hand_edit_and_regeneration_repairs_it(tmp_path, capsys):
    unasync = _script()
    [(src, dst)] = unasync.PAIRS
    copy = tmp_path / "_sync.py"
    edited = dst.read_text().replace("raise call.give_up_error(err)", "raise err")
    assert edited != dst.read_text()
    copy.write_text(edited)
    unasync.PAIRS = [(src, copy)]
    assert unasync.main(["--check"]) == 1
    assert "+                raise call.give_up_error(err)" in capsys.readouterr().out
    assert unasync.main([]) == 0
    assert copy.read_text() == dst.read_text()
    assert unasync.main(["--check"]) == 0


def test_generation_rewrites_names_calls_and_prose():
    unasync = _script()
    out = unasync.unasync(
        "async def f(s: AsyncStream) -> None:\n"
        '    """Leave an ``async for`` early; ``await anext(s)``; ``asyncio.sleep``."""\n'
        "    async with httpx2.AsyncClient() as c:\n"
        "        async for b in r.aiter_bytes():\n"
        "            await r.aclose()\n"
        "    return await r.aread()  # noqa: ASYNC109\n"
    )
    assert out.endswith(
        "def f(s: Stream) -> None:\n"
        '    """Leave an ``for`` early; ``next(s)``; ``time.sleep``."""\n'
        "    with httpx2.Client() as c:\n"
        "        for b in r.iter_bytes():\n"
        "            r.close()\n"
        "    return r.read()\n"
    )
