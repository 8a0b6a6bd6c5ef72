"""What `pip install streamsafe` brings: the client and the pure retry core with a small set of
dependencies in ranges (the servers are the ``gateway`` extra), the tested set pinned in
requirements/lock.txt; the sdist and wheel `python -m build` makes pass `twine check` and carry
the one version, src/streamsafe/_version.py's."""

from __future__ import annotations

import ast
import email
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

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


#: Run first in a process as after `pip install streamsafe`: every server package missing.
_BLOCKED = ", ".join(repr(p) for p in (*SERVER_PACKAGES, "prometheus_client"))
_WITHOUT_SERVERS = f"""
import importlib.abc, sys
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ({_BLOCKED}):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Missing())
"""
_CLIENT_ALONE = f"""
import streamsafe
from streamsafe import AsyncClient, Client, RetryPolicy
with Client(base_url="http://127.0.0.1:9/v1", api_key="x") as client:
    pass
print("ok", sorted(m for m in sys.modules if m.split(".")[0] in ({_BLOCKED})))
"""


@pytest.mark.integration
def test_the_client_imports_and_builds_without_any_server_package() -> None:
    code = _WITHOUT_SERVERS + _CLIENT_ALONE
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok []"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["--help"], 0, "streamsafe[gateway]"),
        (["-v", "serve", "--help"], 2, "[gateway]"),
        (["serve", "--upstream", "http://127.0.0.1:9", "--port", "0"], 2, "[gateway]"),
        (["demo", "--quick"], 2, "streamsafe[demo]"),
    ],
)
def test_the_command_line_names_the_extra_without_a_server_package(
    argv: list[str], code: int, says: str
) -> None:
    # `streamsafe serve` registers its options from the gateway, which imports httptools: a
    # traceback at parser build, before this, for every command but chat.
    run = _WITHOUT_SERVERS + f"from streamsafe.cli import main; sys.exit(main({argv!r}))"
    out = subprocess.run(
        [sys.executable, "-c", run], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == code, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert says in (out.stdout if code == 0 else out.stderr)
    if code:
        assert out.stderr.count("\n") == 1, out.stderr


#: Extras that reproduce the reported failure with the versions it was reported on (Llama Stack
#: 0.2.12 and its client; streamsafe.bench.llamastack runs that server's module path, which
#: later releases renamed): the only requirements pinned exactly, and only `dev` pulls them in.
REPRODUCTION_EXTRAS = ("peers", "llamastack")


def test_exact_pins_are_confined_to_the_reproduction_extras() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    pinned = {name for name, reqs in extras.items() for r in reqs if "==" in r}
    assert pinned <= set(REPRODUCTION_EXTRAS), pinned
    for name, reqs in extras.items():
        pulled = {r.split("[", 1)[1].split("]")[0] for r in reqs if r.startswith("streamsafe[")}
        pulled_names = {e.strip() for group in pulled for e in group.split(",")}
        if name != "dev":
            assert not pulled_names & set(REPRODUCTION_EXTRAS), (name, pulled_names)


def _source_version() -> str:
    tree = ast.parse((ROOT / "src" / "streamsafe" / "_version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__version__":
            return str(ast.literal_eval(node.value))
    raise AssertionError("no __version__ in _version.py")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel built from it, as `python -m build` makes them, from a copy of
    the tree (the build writes build/ and *.egg-info beside the sources); no isolation, so
    nothing is fetched: setuptools comes from the dev extra."""
    tree = tmp_path_factory.mktemp("tree")
    shutil.copy(ROOT / "pyproject.toml", tree)
    shutil.copy(ROOT / "README.md", tree)
    shutil.copytree(
        ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    dist = tree / "dist"
    build = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(tree)]
    out = subprocess.run(build, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return dist


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("*.whl")
    return wheel


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_twine_passes_the_sdist_and_the_wheel(built: Path) -> None:
    files = sorted(str(p) for p in built.iterdir())
    assert len(files) == 2, files
    check = [sys.executable, "-m", "twine", "check", "--strict", *files]
    out = subprocess.run(check, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("PASSED") == 2, out.stdout


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_wheel_requires_no_server_package_and_carries_the_source_version(built: Path) -> None:
    wheel = _wheel(built)
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = (n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(zf.read(meta))
        names = zf.namelist()
    assert metadata["Version"] == _source_version()
    requires = metadata.get_all("Requires-Dist") or []
    core = [r for r in requires if "extra ==" not in r]
    assert sorted(_name(r).strip() for r in core) == ["httpx2", "orjson"], core
    assert not any("==" in r for r in core), core
    assert "streamsafe/py.typed" in names
    assert not any(n.startswith("tests/") for n in names)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_installed_wheel_reports_the_source_version(built: Path, tmp_path: Path) -> None:
    # A wheel of pure Python installs by unpacking; put it first on the path, ahead of the
    # editable install, and ask it what an installed streamsafe says of itself.
    with zipfile.ZipFile(_wheel(built)) as zf:
        zf.extractall(tmp_path)
    code = (
        "import importlib.metadata, streamsafe;"
        "print(importlib.metadata.version('streamsafe'), streamsafe.__version__,"
        " streamsafe.__file__)"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    run = [sys.executable, "-c", code]
    out = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert out.returncode == 0, out.stderr
    meta_version, module_version, where = out.stdout.split()
    assert meta_version == module_version == _source_version()
    assert where.startswith(str(tmp_path))
    cli = [sys.executable, "-m", "streamsafe.cli", "--version"]
    out = subprocess.run(cli, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"streamsafe {_source_version()}"
