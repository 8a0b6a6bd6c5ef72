"""Gateway test fixtures. The helpers live in gateway_helpers.py (importable because this folder
is put on sys.path here; pytest runs with --import-mode=importlib)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def _stub_llama_stack_client_extras() -> None:
    # llama-stack-client 0.2.12 imports `fire` and `requests` at import time for an MCP OAuth
    # command-line helper (lib/tools/mcp_oauth.py) that the chat API never touches; neither is a
    # dependency of this project. Stub them only where they are missing.
    import importlib.util
    import types

    for name in ("fire", "requests"):
        if importlib.util.find_spec(name) is None:
            sys.modules.setdefault(name, types.ModuleType(name))


_stub_llama_stack_client_extras()

from gateway_helpers import Stack, make_stack  # noqa: E402


@pytest.fixture
def stack() -> Iterator[Stack]:
    with make_stack() as s:
        yield s
