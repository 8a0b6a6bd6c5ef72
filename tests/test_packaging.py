"""What `pip install streamsafe` brings: the client and the pure retry core with a small set of
dependencies in ranges (the servers are the ``gateway`` extra) and no benchmark code (the demo
and the benchmarks are streamsafe-bench, benchmarks/ in this repository), the tested set pinned
in requirements/lock.txt; the sdists and wheels `python -m build` makes of both pass `twine
check` and carry the one version, src/streamsafe/_version.py's."""

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
BENCH = ROOT / "benchmarks"
BENCH_PYPROJECT = tomllib.loads((BENCH / "pyproject.toml").read_text())
#: What only the servers need.
SERVER_PACKAGES = ("uvicorn", "uvloop", "httptools", "prometheus", "redis", "cryptography")
#: The benchmarks' package and what only it needs: not installed by `pip install streamsafe`.
BENCH_PACKAGES = ("streamsafe_bench", "rich", "matplotlib", "openai", "llama_stack")


def _name(requirement: str) -> str:
    return requirement.split(";")[0].split("[")[0].split("~")[0].split(">")[0].split("=")[0]


def test_the_core_dependencies_are_ranges_without_a_server_among_them() -> None:
    core = PYPROJECT["project"]["dependencies"]
    assert core and not any("==" in r for r in core), core
    unwanted = (*SERVER_PACKAGES, *BENCH_PACKAGES)
    assert not any(_name(r).strip().replace("-", "_").startswith(unwanted) for r in core), core
    gateway = {_name(r).strip() for r in PYPROJECT["project"]["optional-dependencies"]["gateway"]}
    assert {"uvicorn", "httptools", "redis", "prometheus-client"} <= gateway


def test_every_requirement_is_pinned_in_the_lock_file() -> None:
    pins = {
        line.split("==")[0].lower().replace("_", "-")
        for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    wanted = []
    for project in (PYPROJECT, BENCH_PYPROJECT):
        extras = project["project"].get("optional-dependencies", {})
        wanted += [*project["project"]["dependencies"], *(r for rs in extras.values() for r in rs)]
    names = {_name(r).strip().lower().replace("_", "-") for r in wanted}
    assert names - {"streamsafe"} <= pins, names - pins


#: Run first in a process as after `pip install streamsafe`: every server package missing, and
#: the benchmarks.
_BLOCKED = ", ".join(repr(p) for p in (*SERVER_PACKAGES, "prometheus_client", *BENCH_PACKAGES))
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
        (["--help"], 0, "(needs pip install ./benchmarks)"),
        (["demo", "--quick"], 2, "needs streamsafe_bench, which streamsafe-bench installs"),
        (["bench", "sse"], 2, "from a clone of streamsafe: pip install ./benchmarks (or make"),
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


#: Extras of streamsafe-bench that reproduce the reported failure with the versions it was
#: reported on (Llama Stack 0.2.12 and its client; streamsafe_bench.llamastack runs that server's
#: module path, which later releases renamed): the only requirements pinned exactly, besides
#: streamsafe-bench's pin of the streamsafe it is released with; no extra pulls them in.
REPRODUCTION_EXTRAS = ("peers", "llamastack")


def test_exact_pins_are_confined_to_the_reproduction_extras() -> None:
    assert not any(
        "==" in r for rs in PYPROJECT["project"]["optional-dependencies"].values() for r in rs
    )
    extras = BENCH_PYPROJECT["project"]["optional-dependencies"]
    pinned = {name for name, reqs in extras.items() for r in reqs if "==" in r}
    assert pinned == set(REPRODUCTION_EXTRAS), pinned
    for project in (PYPROJECT, BENCH_PYPROJECT):
        for reqs in project["project"].get("optional-dependencies", {}).values():
            assert not any(r.startswith("streamsafe-bench") for r in reqs), reqs


def test_the_benchmarks_are_released_with_the_streamsafe_they_require() -> None:
    # One repository, one commit: streamsafe-bench drives the gateway's own classes, so it
    # requires exactly the streamsafe of its own version, and never the reproduction pins.
    bench = BENCH_PYPROJECT["project"]
    assert bench["name"] == "streamsafe-bench" and bench["version"] == _source_version()
    assert f"streamsafe[gateway]=={_source_version()}" in bench["dependencies"]
    assert not set(REPRODUCTION_EXTRAS) & set(PYPROJECT["project"]["optional-dependencies"])
    # Not for the package index: a name there may be anyone's.
    assert "Private :: Do Not Upload" in bench["classifiers"]


def _source_version() -> str:
    tree = ast.parse((ROOT / "src" / "streamsafe" / "_version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__version__":
            return str(ast.literal_eval(node.value))
    raise AssertionError("no __version__ in _version.py")


def _build(project: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel built from it, as `python -m build` makes them, from a copy of
    ``project`` (the build writes build/ and *.egg-info beside the sources); no isolation, so
    nothing is fetched: setuptools comes from the dev extra."""
    tree = tmp_path_factory.mktemp("tree")
    shutil.copy(project / "pyproject.toml", tree)
    shutil.copy(project / "README.md", tree)
    shutil.copytree(
        project / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    dist = tree / "dist"
    build = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(tree)]
    out = subprocess.run(build, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return dist


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """streamsafe's sdist and wheel."""
    return _build(ROOT, tmp_path_factory)


@pytest.fixture(scope="module")
def built_bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """streamsafe-bench's sdist and wheel."""
    return _build(BENCH, tmp_path_factory)


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("*.whl")
    return wheel


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_twine_passes_the_sdists_and_the_wheels(built: Path, built_bench: Path) -> None:
    files = sorted(str(p) for dist in (built, built_bench) for p in dist.iterdir())
    assert len(files) == 4, files
    check = [sys.executable, "-m", "twine", "check", "--strict", *files]
    out = subprocess.run(check, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("PASSED") == 4, out.stdout


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_wheel_holds_no_benchmark_code(built: Path) -> None:
    with zipfile.ZipFile(_wheel(built)) as zf:
        names = zf.namelist()
    modules = [n for n in names if n.endswith(".py")]
    assert "streamsafe/gateway/app.py" in modules and "streamsafe/cli.py" in modules
    assert not [n for n in names if n.startswith(("streamsafe/bench/", "streamsafe_bench"))]
    # Exactly streamsafe's own sources, nothing brought in from beside them.
    sources = ROOT / "src"
    assert set(modules) == {p.relative_to(sources).as_posix() for p in sources.rglob("*.py")}


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_benchmarks_wheel_holds_them_and_requires_this_streamsafe(built_bench: Path) -> None:
    with zipfile.ZipFile(_wheel(built_bench)) as zf:
        (meta,) = (n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(zf.read(meta))
        names = set(zf.namelist())
    assert metadata["Name"] == "streamsafe-bench"
    assert metadata["Version"] == _source_version()
    sources = BENCH / "src" / "streamsafe_bench"
    wanted = {f"streamsafe_bench/{p.name}" for p in sources.glob("*.py")}
    assert wanted | {"streamsafe_bench/py.typed"} <= names, wanted - names
    assert not any(n.startswith("streamsafe/") for n in names)
    requires = metadata.get_all("Requires-Dist") or []
    assert f"streamsafe[gateway]=={_source_version()}" in requires, requires


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
