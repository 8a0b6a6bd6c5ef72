"""The layering promises: importing the retry core loads no server, no HTTP client and no JSON
library; importing the client loads no server; the servers never import the client (nor each
other); the HTTP server under them imports nothing of theirs; no import circle; and streamsafe
never imports the benchmarks (streamsafe_bench, a distribution of its own, which sits on top:
the command line names it only as a module to import when ``demo`` or ``bench`` runs)."""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

import streamsafe
import streamsafe_bench

pytestmark = pytest.mark.unit

SRC = pathlib.Path(streamsafe.__file__).parent
BENCH = pathlib.Path(streamsafe_bench.__file__).parent
#: The top-level packages whose imports are followed.
OURS = ("streamsafe", "streamsafe_bench")
#: Third-party modules the retry core must not pull in (they cost most of a server's import).
HEAVY = ("httpx2", "httpcore2", "orjson", "prometheus_client", "uvicorn", "anyio")


def _loaded_after(statement: str) -> set[str]:
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(json.loads(out.stdout))


@pytest.mark.integration
def test_importing_the_retry_core_loads_no_server_and_no_third_party_package() -> None:
    loaded = _loaded_after("import streamsafe.retry")
    ours = {m for m in loaded if m.startswith("streamsafe")}
    assert ours <= {"streamsafe"} | {m for m in ours if m.startswith("streamsafe.retry")}, ours
    assert not {m.split(".")[0] for m in loaded} & set(HEAVY)


@pytest.mark.integration
def test_importing_the_package_loads_nothing_until_a_name_is_used() -> None:
    loaded = _loaded_after("import streamsafe")
    assert {m for m in loaded if m.startswith("streamsafe")} == {"streamsafe"}
    loaded = _loaded_after("from streamsafe import SSEDecoder, __version__")
    assert not {m for m in loaded if m.startswith(("streamsafe.gateway", "streamsafe.client"))}


@pytest.mark.integration  # a fresh interpreter
def test_importing_the_client_loads_no_server() -> None:
    loaded = _loaded_after("import streamsafe.client, streamsafe.sdk")
    servers = ("streamsafe.server", "streamsafe.gateway", "streamsafe.engine_sim")
    assert not {m for m in loaded if m.startswith(servers)}, sorted(loaded)
    assert not {m.split(".")[0] for m in loaded} & {"uvicorn", "httptools"}


@pytest.mark.integration  # a fresh interpreter
def test_an_app_importing_the_asgi_helpers_loads_no_server_runner() -> None:
    # The gateway's and the simulator's modules import streamsafe.server.asgi (and the option
    # parsers streamsafe.server.tls) at the top; the runner, uvicorn and the protocol load only
    # when a server is started.
    loaded = _loaded_after("import streamsafe.server.asgi, streamsafe.server.tls")
    ours = {m for m in loaded if m.startswith("streamsafe")}
    assert ours == {
        "streamsafe",
        "streamsafe.server",
        "streamsafe.server.asgi",
        "streamsafe.server.tls",
    }
    assert not {m.split(".")[0] for m in loaded} & {"uvicorn", "httptools"}


def _module_name(path: pathlib.Path, package: pathlib.Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p, pkg): p for pkg in (SRC, BENCH) for p in pkg.rglob("*.py")}


def _imports(tree: ast.AST, module: str) -> Iterator[str]:
    """Our modules ``tree`` imports (a name imported from a package counts as the submodule
    where there is one)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = module.split(".")[: -node.level]
                target = ".".join([*base, target] if target else base)
            if target.split(".")[0] not in OURS:
                continue
            yield target
            for alias in node.names:
                if f"{target}.{alias.name}" in MODULES:
                    yield f"{target}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    yield alias.name


def _part(module: str) -> str:
    """The subpackage (``streamsafe.gateway``) or top-level module a module belongs to; the
    benchmarks are one part, ``streamsafe_bench``."""
    parts = module.split(".")
    if parts[0] == "streamsafe_bench":
        return "streamsafe_bench"
    if len(parts) > 1 and (SRC / parts[1]).is_dir():
        return ".".join(parts[:2])
    return module


GRAPH = {m: set(_imports(ast.parse(p.read_text()), m)) - {m} for m, p in MODULES.items()}
PARTS: dict[str, set[str]] = {}
for _m, _targets in GRAPH.items():
    PARTS.setdefault(_part(_m), set()).update(_part(t) for t in _targets if _part(t) != _part(_m))


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph``, or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_import_circle_between_parts() -> None:
    assert _cycle(PARTS) is None, " -> ".join(_cycle(PARTS) or ())


def test_no_import_circle_between_modules() -> None:
    assert _cycle(GRAPH) is None, " -> ".join(_cycle(GRAPH) or ())


def test_servers_import_neither_the_client_nor_each_other() -> None:
    assert not PARTS["streamsafe.gateway"] & {
        "streamsafe.client",
        "streamsafe.engine_sim",
        "streamsafe_bench",
    }
    assert not PARTS["streamsafe.engine_sim"] & {
        "streamsafe.client",
        "streamsafe.gateway",
        "streamsafe_bench",
    }


def test_nothing_in_streamsafe_imports_the_benchmarks() -> None:
    # `pip install streamsafe` holds no streamsafe_bench: an import of it anywhere in streamsafe
    # would fail there (the command line loads it by name, through importlib, when asked).
    wrong = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if module.split(".")[0] == "streamsafe"
        for target in targets
        if target.split(".")[0] == "streamsafe_bench"
    ]
    assert not wrong, "\n".join(wrong)
    assert not any(m.startswith("streamsafe.bench") for m in MODULES), "the old bench package"


def test_the_benchmarks_are_a_part_above_the_rest() -> None:
    assert {"streamsafe.gateway", "streamsafe.engine_sim", "streamsafe.server"} <= PARTS[
        "streamsafe_bench"
    ]
    assert not any("streamsafe_bench" in targets for part, targets in PARTS.items()), PARTS


def test_the_client_side_never_imports_a_server() -> None:
    servers = {"streamsafe.server", "streamsafe.gateway", "streamsafe.engine_sim"}
    for part in ("streamsafe", "streamsafe.client", "streamsafe.sdk", "streamsafe.sse"):
        assert not PARTS.get(part, set()) & servers, (part, PARTS.get(part))


def test_the_http_server_imports_no_other_part() -> None:
    # It runs every app here (gateway, simulator, the benchmarks' peers), so it is below them all.
    assert PARTS["streamsafe.server"] == set(), PARTS["streamsafe.server"]


def test_the_pure_core_imports_no_other_part() -> None:
    assert PARTS.get("streamsafe.retry", set()) == set()
    # The codec's one error is a StreamsafeError, so a caller catches everything with one name;
    # that root lives alone in _errors, which imports nothing.
    assert PARTS.get("streamsafe.sse", set()) <= {"streamsafe._errors"}
    assert PARTS.get("streamsafe._errors", set()) == set()


# -- the HTTP server's own modules (docs/design.md, Layout) --------------------------------------

SERVER = SRC / "server"
#: The server's modules, lowest first: a module imports only modules of a lower rank.
SERVER_RANKS = {
    "asgi": 0,
    "limits": 0,
    "tls": 0,
    "unfinished": 0,
    "uvicorn_link": 0,
    "flow": 1,
    "request": 1,
    "cycle": 2,
    "deadlines": 3,
    "protocol": 4,
    "run": 5,
    "__init__": 6,
}
#: What the rest of the package may import of the server: the runner (re-exported by the
#: package), the ASGI helpers the apps are written against and the TLS options. The connection's
#: insides (protocol, deadlines, cycle, request, flow, unfinished, uvicorn_link, limits) stay the
#: server's.
SERVER_FACE = {"streamsafe.server", "streamsafe.server.asgi", "streamsafe.server.tls"}


def _server_module(module: str) -> str | None:
    """``protocol`` for ``streamsafe.server.protocol``; ``__init__`` for the package."""
    if module == "streamsafe.server":
        return "__init__"
    parts = module.split(".")
    return parts[2] if parts[:2] == ["streamsafe", "server"] and len(parts) == 3 else None


def test_the_server_ranks_name_every_module() -> None:
    assert {p.stem for p in SERVER.glob("*.py")} == set(SERVER_RANKS)


def test_server_modules_import_only_lower_ranks() -> None:
    wrong = []
    for module, targets in GRAPH.items():
        if (name := _server_module(module)) is None:
            continue
        for target in targets:
            other = _server_module(target)
            if other is not None and SERVER_RANKS[other] >= SERVER_RANKS[name]:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "\n".join(wrong)


def test_the_rest_uses_the_server_through_its_face() -> None:
    wrong = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if _server_module(module) is None
        for target in targets
        if _server_module(target) is not None and target not in SERVER_FACE
    ]
    assert not wrong, "\n".join(wrong)


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


#: The modules of the gateway's series (``/stats``, ``/metrics``, the dashboard): the package.
GATEWAY_METRICS = sorted(
    m for m in GRAPH if m.split(".")[:3] == ["streamsafe", "gateway", "metrics"]
)


def test_inside_the_gateway_the_relay_and_the_metrics_import_no_owner() -> None:
    assert "streamsafe.gateway.registry" not in GRAPH["streamsafe.gateway.relay.relay"]
    assert "streamsafe.gateway.metrics.counters" in GATEWAY_METRICS, GATEWAY_METRICS
    for module in GATEWAY_METRICS:
        owners = {"streamsafe.gateway.app", "streamsafe.gateway.registry"}
        assert not owners & GRAPH[module], module
    for name in ("cli", "cli_options", "cli_bounds"):
        parts = {_part(m) for m in GRAPH[f"streamsafe.gateway.{name}"]}
        assert "streamsafe.engine_sim" not in parts, name


# -- the gateway's own parts (docs/design.md, Layout) --------------------------------------------

GATEWAY = SRC / "gateway"
#: The gateway's sub-packages, lowest first: a package imports only packages of a lower rank
#: (and the base modules below). Equal ranks do not import each other.
GATEWAY_RANKS = {
    "metrics": -1,
    "upstream": 0,
    "admission": 0,
    "generations": 1,
    "engines": 2,
    "relay": 3,
    "replicas": 3,
    "serving": 4,
}
#: Top-level modules every part may use: they import no sub-package.
GATEWAY_BASE = {"config", "errors", "tracing"}
#: At most this many modules at the top of ``gateway/`` (the rest live in the parts).
GATEWAY_TOP_MODULES = 12


def _gateway_part(module: str) -> str | None:
    """``relay`` for ``streamsafe.gateway.relay.stream_reader``; ``None`` for a top module."""
    parts = module.split(".")
    if parts[:2] != ["streamsafe", "gateway"] or len(parts) < 4:
        return None
    return parts[2]


def test_the_gateway_is_its_parts_plus_a_few_modules() -> None:
    packages = {p.name for p in GATEWAY.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(GATEWAY_RANKS), packages
    top = [p.stem for p in GATEWAY.glob("*.py") if p.stem != "__init__"]
    assert len(top) <= GATEWAY_TOP_MODULES, sorted(top)


def test_gateway_parts_import_only_lower_parts_and_the_base() -> None:
    wrong = []
    for module, targets in GRAPH.items():
        part = _gateway_part(module)
        if part is None:
            continue
        for target in targets:
            if not target.startswith("streamsafe.gateway"):
                continue
            other = _gateway_part(target)
            if other is None:
                name = target.split(".")[2] if target.count(".") >= 2 else ""
                if name and name not in GATEWAY_BASE and (GATEWAY / f"{name}.py").is_file():
                    wrong.append(f"{module} -> {target} (a top module above the parts)")
            elif other != part and GATEWAY_RANKS[other] >= GATEWAY_RANKS[part]:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "\n".join(wrong)


def test_the_base_modules_import_no_part() -> None:
    for name in GATEWAY_BASE:
        targets = GRAPH[f"streamsafe.gateway.{name}"]
        assert not {t for t in targets if _gateway_part(t) is not None}, (name, targets)


def test_the_rank_check_sees_a_wrong_import() -> None:
    # generation (rank 1) importing the relay (rank 3) is what the rule above must catch.
    assert GATEWAY_RANKS["relay"] > GATEWAY_RANKS["generations"]
    assert _gateway_part("streamsafe.gateway.relay.relay") == "relay"
    assert _gateway_part("streamsafe.gateway.registry") is None
