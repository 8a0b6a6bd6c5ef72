"""What `pip install streamsafe` brings: the client and the pure retry core with a small set of
dependencies in ranges (the servers are the ``gateway`` extra), the tested set pinned in
requirements/lock.txt."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: What only the servers need.
SERVER_PACKAGES = ("uvicorn", "uvloop", "httptools", "prometheus", "redis", "cryptography", "rich")


def _name(requirement: str) -> str:
    return requirement.split(";")[0].split("[")[0].split("~")[0].split(">")[0].split("=")[0]


def test_the_core_dependencies_are_ranges_without_a_server_among_them() -> None:
    core = PYPROJECT["project"]["dependencies"]
    assert core and not any("==" in r for r in core), core
    assert not any(_name(r).strip().startswith(SERVER_PACKAGES) for r in core), core
    gateway = {_name(r).strip() for r in PYPROJECT["project"]["optional-dependencies"]["gateway"]}
    assert {"uvicorn", "httptools", "redis", "prometheus-client"} <= gateway


def test_every_requirement_is_pinned_in_the_lock_file() -> None:
    pins = {
        line.split("==")[0].lower().replace("_", "-")
        for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    extras = PYPROJECT["project"]["optional-dependencies"]
    wanted = [*PYPROJECT["project"]["dependencies"], *(r for rs in extras.values() for r in rs)]
    names = {_name(r).strip().lower().replace("_", "-") for r in wanted}
    assert names - {"streamsafe"} <= pins, names - pins


def test_the_client_imports_and_builds_without_any_server_package() -> None:
    # A process in which every server package is missing, as after `pip install streamsafe`.
    blocked = ", ".join(repr(p) for p in (*SERVER_PACKAGES, "prometheus_client"))
    code = f"""
import importlib.abc, sys
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ({blocked}):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Missing())
import streamsafe
from streamsafe import AsyncClient, Client, RetryPolicy
with Client(base_url="http://127.0.0.1:9/v1", api_key="x") as client:
    pass
print("ok", sorted(m for m in sys.modules if m.split(".")[0] in ({blocked})))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok []"
