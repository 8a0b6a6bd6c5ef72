"""The code the README and docs/ show runs, as written, against a gateway with the simulator
behind it: the README's answers to the original report's three questions, and every block in
docs/*.md marked ``<!-- readme-test -->``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread

_ROOT = Path(__file__).resolve().parent.parent
_README = _ROOT / "README.md"
_DOCS = sorted((_ROOT / "docs").glob("*.md"))
_BLOCK = re.compile(r"<!-- readme-test -->\n```python\n(.*?)```", re.S)
_BLOCKS = _BLOCK.findall(_README.read_text())
_DOC_BLOCKS = [
    (f"{path.name} block {i + 1}", code)
    for path in _DOCS
    for i, code in enumerate(_BLOCK.findall(path.read_text()))
]


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    sim = Simulator(SimConfig(itl_ms=1.0, itl_ms_per_seq=0.0, prefill_ms_per_token=0.0))
    with ServerThread(sim) as engine:
        gw = Gateway(GatewayConfig(upstream=engine.url, heartbeat=0.5))
        with ServerThread(gw) as gateway:
            yield gateway.url + "/v1"


def test_readme_has_the_three_answers():
    assert len(_BLOCKS) == 3


def test_docs_have_runnable_examples():
    # The client, gateway and simulator pages each show code that runs.
    pages = {name.split(" block ")[0] for name, _ in _DOC_BLOCKS}
    assert {"client.md", "gateway.md", "simulator.md"} <= pages


@pytest.mark.parametrize("index", range(len(_BLOCKS)))
def test_readme_example_runs(index: int, base_url: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENAI_BASE_URL", base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "none")
    exec(compile(_BLOCKS[index], f"README block {index + 1}", "exec"), {})


@pytest.mark.parametrize(("name", "code"), _DOC_BLOCKS, ids=[name for name, _ in _DOC_BLOCKS])
def test_docs_example_runs(name: str, code: str, base_url: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENAI_BASE_URL", base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "none")
    exec(compile(code, name, "exec"), {"__name__": "__docs__"})
