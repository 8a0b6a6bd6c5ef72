"""A function a reader can hold (STYLE.md): none in src/ or benchmarks/src/ runs over 60 lines
unless it says why, checked by scripts/long_functions.py."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
import textwrap
from types import ModuleType

import pytest

pytestmark = pytest.mark.timeout(60)

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "long_functions.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("long_functions", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["long_functions"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _function(name: str, head: str, length: int) -> str:
    """A function ``length`` lines long, from its ``def`` line, whose body opens with ``head``."""
    lines = [f"def {name}() -> None:", *(f"    {line}" for line in head.splitlines())]
    lines += ["    x = 1"] * (length - len(lines))
    return "\n".join(lines) + "\n"


def test_no_function_in_src_is_long_without_saying_why() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=50, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_check_finds_a_long_function_and_takes_a_reason_near_its_top(
    tmp_path: pathlib.Path,
) -> None:
    limit, window = _script().LIMIT, _script().WINDOW
    source = "".join(
        [
            _function("short", "", limit),
            _function("bare", "", limit + 1),
            _function("after_doc", '"""Doc."""\n# Long because one dispatch.', limit + 1),
            _function("no_doc", "# Long because one frame per chunk.", limit + 1),
            _function("too_deep", "y = 0\n" * window + "# Long because too late.", limit + 1),
        ]
    )
    (tmp_path / "module.py").write_text(source)
    nested = textwrap.indent(_function("method", "", limit + 1), "    ")
    (tmp_path / "klass.py").write_text("class Klass:\n" + nested)
    found = {f.name: f for f in _script().long_functions(tmp_path)}
    assert set(found) == {"bare", "after_doc", "no_doc", "too_deep", "Klass.method"}
    assert {name for name, f in found.items() if f.explained} == {"after_doc", "no_doc"}
    assert found["bare"].length == limit + 1
