"""The proxies ``bench peers`` puts between the load and the simulator, each as a real process on
a free loopback port: nginx (Debian's package), the leanest relay Python allows
(:mod:`streamsafe_bench.floor_relay`, the floor for any Python proxy measured in the same run),
the LiteLLM proxy (in its own virtualenv), and streamsafe's gateway: with its defaults in front
of one engine and in front of a pool of two (``--upstream A --upstream B``, what a user with two
engines runs), and with ``--commit first-token``.

Every peer is started in front of the same engines (simulators the bench runs); a peer uses the
first, the pool the first two.

A peer that cannot be started is reported as missing with the reason, never dropped in silence.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from streamsafe_bench.load import API_KEY
from streamsafe_bench.processes import free_port, http_ok, launched

__all__ = [
    "LITELLM_VERSION",
    "PEERS",
    "Missing",
    "Peer",
    "default_litellm_python",
    "engines_used",
    "start_peer",
]

PEERS = (
    "direct",
    "nginx",
    "python-floor",
    "litellm",
    "streamsafe",
    "streamsafe-pool",
    "streamsafe-first-token",
)
"""Every peer, in the order the table shows them."""

LITELLM_VERSION = "1.108.5"
"""The LiteLLM proxy release measured (``make peers`` installs it into ``.venv-litellm``)."""

MODEL = "sim-llama-8b"


@dataclass(frozen=True)
class Peer:
    """A running path from the load to the simulator."""

    name: str
    url: str
    pid: int | None  # the process to charge CPU and memory to; None for direct
    version: str
    command: str


class Missing(Exception):
    """A peer that could not be started, with the reason."""


def default_litellm_python() -> str:
    """The LiteLLM proxy's interpreter: ``$STREAMSAFE_LITELLM_PYTHON``, else
    ``.venv-litellm/bin/python`` in the current folder (where ``make peers`` puts it)."""
    return os.environ.get("STREAMSAFE_LITELLM_PYTHON", ".venv-litellm/bin/python")


_NGINX_CONF = """\
worker_processes 1;
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    upstream engine {{
        server {upstream};
        keepalive 256;
    }}
    server {{
        listen 127.0.0.1:{port};
        location = /bench-health {{ return 200 "ok\\n"; }}
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_cache off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


@contextlib.contextmanager
def _nginx(upstream: str) -> Iterator[Peer]:
    exe = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )
    if exe is None:
        raise Missing("nginx is not installed (`make nginx` unpacks Debian's package into .nginx)")
    version = subprocess.run([exe, "-v"], capture_output=True, text=True).stderr.strip()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-nginx-") as d:
        conf = Path(d, "nginx.conf")
        hostport = upstream.removeprefix("http://").rstrip("/")
        conf.write_text(_NGINX_CONF.format(d=d, upstream=hostport, port=port))
        cmd = [exe, "-p", d + "/", "-c", str(conf), "-e", f"{d}/error.log"]
        url = f"http://127.0.0.1:{port}"
        with launched(cmd, name="nginx", ready=http_ok(url + "/bench-health")) as proc:
            yield Peer(
                "nginx", url, proc.pid, version.removeprefix("nginx version: "), " ".join(cmd)
            )


_LITELLM_CONF = """\
model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {upstream}/v1
      api_key: bench
general_settings:
  master_key: {key}
litellm_settings:
  telemetry: false
"""


@contextlib.contextmanager
def _litellm(upstream: str, python: str) -> Iterator[Peer]:
    python = os.path.abspath(python)  # the proxy runs in its own folder
    if not os.access(python, os.X_OK):
        raise Missing(f"no LiteLLM virtualenv at {python} (make peers installs it)")
    probe = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        raise Missing(f"litellm is not importable from {python}: {probe.stderr[-300:]}")
    version = probe.stdout.strip()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-litellm-") as d:
        conf = Path(d, "config.yaml")
        conf.write_text(_LITELLM_CONF.format(model=MODEL, upstream=upstream, key=API_KEY))
        exe = str(Path(python).parent / "litellm")
        cmd = [exe, "--config", str(conf), "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--num_workers", "1"]
        # No database, no cost map fetched from the network, no telemetry, quiet logs.
        env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR")
        env.pop("DATABASE_URL", None)
        url = f"http://127.0.0.1:{port}"
        ready = http_ok(url + "/health/liveliness")
        with launched(cmd, name="litellm", ready=ready, timeout_s=180, env=env, cwd=d) as proc:
            yield Peer("litellm", url, proc.pid, version, " ".join(cmd))


@dataclass(frozen=True)
class _Gateway:
    """One way of running ``streamsafe serve`` as a peer: the same command, parametrised."""

    commit: str
    engines: int  # how many of the bench's engines it is given, one ``--upstream`` each


_GATEWAYS = {
    "streamsafe": _Gateway(commit="early", engines=1),
    "streamsafe-pool": _Gateway(commit="early", engines=2),
    "streamsafe-first-token": _Gateway(commit="first-token", engines=1),
}


def engines_used(name: str) -> int:
    """How many engines peer ``name`` sits in front of (the bench starts as many as the most
    any requested peer uses)."""
    gateway = _GATEWAYS.get(name)
    return gateway.engines if gateway is not None else 1


@contextlib.contextmanager
def _streamsafe(name: str, engines: Sequence[str]) -> Iterator[Peer]:
    from streamsafe import __version__

    gateway = _GATEWAYS[name]
    if len(engines) < gateway.engines:
        raise ValueError(f"{name} needs {gateway.engines} engines, given {len(engines)}")
    port = free_port()
    cmd = [sys.executable, "-m", "streamsafe.cli", "serve"]
    for url in engines[: gateway.engines]:
        cmd += ["--upstream", url]
    cmd += ["--port", str(port), "--log-level", "warning", "--commit", gateway.commit]
    url = f"http://127.0.0.1:{port}"
    with launched(cmd, name=name, ready=http_ok(url + "/health")) as proc:
        yield Peer(name, url, proc.pid, __version__, " ".join(cmd))


@contextlib.contextmanager
def _python_floor(upstream: str) -> Iterator[Peer]:
    port = free_port()
    hostport = upstream.removeprefix("http://").rstrip("/")
    cmd = [sys.executable, "-m", "streamsafe_bench.floor_relay", hostport, str(port)]
    url = f"http://127.0.0.1:{port}"
    with launched(cmd, name="python-floor", ready=http_ok(url + "/health")) as proc:
        version = f"python {sys.version_info[0]}.{sys.version_info[1]}"
        yield Peer("python-floor", url, proc.pid, version, " ".join(cmd))


@contextlib.contextmanager
def start_peer(name: str, engines: Sequence[str], *, litellm_python: str) -> Iterator[Peer]:
    """Start peer ``name`` in front of ``engines`` (their base URLs; every peer but a pool uses
    the first); raise :class:`Missing` if it cannot be."""
    upstream = engines[0]
    if name == "direct":
        yield Peer("direct", upstream, None, "-", "-")
    elif name == "nginx":
        with _nginx(upstream) as peer:
            yield peer
    elif name == "python-floor":
        with _python_floor(upstream) as peer:
            yield peer
    elif name == "litellm":
        with _litellm(upstream, litellm_python) as peer:
            yield peer
    elif name in _GATEWAYS:
        with _streamsafe(name, engines) as peer:
            yield peer
    else:
        raise ValueError(f"unknown peer {name!r}; choose from {', '.join(PEERS)}")
