"""The real Llama Stack server as a process on loopback, in front of an engine, for tests and the
demo.

:class:`LlamaStackServer` writes a run config (:func:`run_config`: only the inference API, one
``remote::vllm`` provider whose ``url`` is the engine's ``/v1`` base, the engine's model
registered under its own id, sqlite stores in a temporary directory), starts
``python -m llama_stack.distribution.server.server --config run.yaml --port P`` as a child process,
waits until ``/v1/health`` answers 200, and stops it. Nothing is written outside that directory:
``LLAMA_STACK_CONFIG_DIR`` points there too, because the server keeps its trace store under it.

Llama Stack registers the model at start-up by listing the engine's models, and keeps the
provider URL for its lifetime: a test session or a demo run starts it once in front of an engine
slot whose engine is replaced between scenarios (:mod:`streamsafe_bench.llamastack_deployment`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2

from streamsafe.server import bind_socket
from streamsafe_bench.processes import free_port, stop_process

__all__ = ["LLAMA_STACK_VERSION", "LlamaStackServer", "run_config"]

#: The Llama Stack release this module and its tests were measured against.
LLAMA_STACK_VERSION = "0.2.12"


def run_config(
    engine_url: str,
    model: str,
    state_dir: str | os.PathLike[str],
    *,
    port: int = 8321,
    provider_max_tokens: int = 4096,
) -> dict[str, Any]:
    """A Llama Stack 0.2.12 run config with only the inference API in front of one engine.

    ``engine_url`` is the engine's base (``http://host:port``; ``/v1`` is added unless present).
    ``model`` is registered under its own name, so callers use the engine's model id with either
    API. ``provider_max_tokens`` is the ``max_tokens`` Llama Stack sends when a native request
    sets none (4096, Llama Stack's default). Stores live in ``state_dir``.
    """
    base = engine_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    state = Path(state_dir)
    return {
        "version": "2",
        "image_name": "streamsafe-llamastack",
        "apis": ["inference"],
        "providers": {
            "inference": [
                {
                    "provider_id": "vllm",
                    "provider_type": "remote::vllm",
                    "config": {
                        "url": base,
                        "max_tokens": provider_max_tokens,
                        "api_token": "fake",
                        "tls_verify": False,
                    },
                }
            ]
        },
        "metadata_store": {"type": "sqlite", "db_path": str(state / "registry.db")},
        "inference_store": {"type": "sqlite", "db_path": str(state / "inference_store.db")},
        "models": [
            {
                "metadata": {},
                "model_id": model,
                "provider_id": "vllm",
                "provider_model_id": model,
                "model_type": "llm",
            }
        ],
        "shields": [],
        "vector_dbs": [],
        "datasets": [],
        "scoring_fns": [],
        "benchmarks": [],
        "tool_groups": [],
        "server": {"port": port, "host": "127.0.0.1"},
    }


class _PortTaken(Exception):
    pass


def _port_taken(port: int) -> bool:
    try:
        bind_socket("127.0.0.1", port).close()
    except OSError:
        return True
    return False


def _listens(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds the socket listening on loopback ``port`` (``None`` where
    ``/proc`` cannot say)."""
    inodes: set[str] = set()
    try:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(FileNotFoundError):
                for line in Path(table).read_text().splitlines()[1:]:
                    fields = line.split()
                    local, state = fields[1], fields[3]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(fields[9])
        fds = os.listdir(f"/proc/{pid}/fd")
    except (OSError, ValueError, IndexError):
        return None
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return True
    return False


class LlamaStackServer:
    """The real Llama Stack server as a child process on a free loopback port.

    >>> with LlamaStackServer("http://127.0.0.1:8000", "sim-llama-8b") as ls:
    ...     httpx2.get(ls.url + "/v1/models")

    ``start()`` returns once ``/v1/health`` answers 200 (within ``start_timeout``, 120 s: a cold
    start imports a great deal on a busy 2-core machine) and records how long that took in
    ``startup_s``. The engine must be serving when it starts: Llama Stack lists the engine's models
    to register the model. ``stop()`` terminates the process (SIGTERM, then SIGKILL after 10 s)
    and removes the state directory. The server's own output goes to ``log_path``.

    ``log_level`` is Llama Stack's for all its log categories (default ``critical``): it logs
    every failed request with a rich-rendered traceback, about half a second of CPU each on a
    busy machine, so a storm of a hundred failures would leave it unresponsive for a minute
    afterwards, which is its logging's doing and not what the demo or the tests are about.
    """

    def __init__(
        self,
        engine_url: str,
        model: str,
        *,
        port: int = 0,
        start_timeout: float = 120.0,
        provider_max_tokens: int = 4096,
        log_level: str = "critical",
        python: str = sys.executable,
    ) -> None:
        self.engine_url = engine_url
        self.model = model
        self._fixed_port = bool(port)
        self.port = port or free_port()
        self.start_timeout = start_timeout
        self.provider_max_tokens = provider_max_tokens
        self.log_level = log_level
        self.python = python
        self.startup_s: float | None = None
        self.state_dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:41234`` (the APIs live under ``/v1``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """Where the server's stdout and stderr go."""
        assert self.state_dir is not None, "not started"
        return self.state_dir / "server.log"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> LlamaStackServer:
        """Write the run config, start the server, wait for ``/v1/health``.

        A free port can be taken by another process between choosing it and the server binding
        it; then the server exits at once and, unless a port was given, it is started again on
        another one (up to 5 times)."""
        self.state_dir = Path(tempfile.mkdtemp(prefix="streamsafe-llamastack-"))
        t0 = time.monotonic()
        for attempt in range(5):
            try:
                self._launch()
                self._wait_healthy(t0 + self.start_timeout)
            except _PortTaken:
                self.stop(keep_state=True)
                if self._fixed_port or attempt == 4:
                    raise RuntimeError(
                        f"Llama Stack could not bind port {self.port}:\n{self.log_tail()}"
                    ) from None
                self.port = free_port()
                continue
            except BaseException:
                self.stop(keep_state=True)
                raise
            self.startup_s = time.monotonic() - t0
            return self
        raise AssertionError("unreachable")

    def _launch(self) -> None:
        assert self.state_dir is not None
        config = run_config(
            self.engine_url,
            self.model,
            self.state_dir,
            port=self.port,
            provider_max_tokens=self.provider_max_tokens,
        )
        config_path = self.state_dir / "run.yaml"
        config_path.write_text(json.dumps(config, indent=2))  # JSON is valid YAML
        env = dict(os.environ)
        env["LLAMA_STACK_CONFIG_DIR"] = str(self.state_dir)
        env["LLAMA_STACK_LOGGING"] = f"all={self.log_level}"
        env.setdefault("PYTHONUNBUFFERED", "1")
        cmd = [
            self.python,
            "-m",
            "llama_stack.distribution.server.server",
            "--config",
            str(config_path),
            "--port",
            str(self.port),
        ]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        self._proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )

    def _wait_healthy(self, deadline: float) -> None:
        # Health is asked only once this process owns the listening socket: another server on
        # a port just taken could answer /v1/health too.
        assert self._proc is not None
        with httpx2.Client(trust_env=False, timeout=2.0, verify=self._verify()) as client:
            while True:
                if self._proc.poll() is not None:
                    if b"address already in use" in self._log_bytes() or _port_taken(self.port):
                        raise _PortTaken
                    raise RuntimeError(
                        f"Llama Stack exited with {self._proc.returncode} before it was healthy; "
                        f"its log ({self.log_path}) ends with:\n{self.log_tail()}"
                    )
                if _listens(self._proc.pid, self.port) is not False:
                    with contextlib.suppress(httpx2.TransportError):
                        if client.get(self.url + "/v1/health").status_code == 200:
                            return
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"Llama Stack was not healthy within {self.start_timeout} s; its log "
                        f"({self.log_path}) ends with:\n{self.log_tail()}"
                    )
                time.sleep(0.1)

    def _verify(self) -> ssl.SSLContext | bool:
        """How the health check verifies the server (it serves plain HTTP here)."""
        return True

    def _log_bytes(self) -> bytes:
        try:
            return self.log_path.read_bytes()
        except OSError:
            return b""

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's output (for failure messages)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, AssertionError):
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, *, keep_state: bool = False) -> None:
        """Stop the server and remove its state directory (kept with ``keep_state``, so a failed
        start can still be read)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            stop_process(proc)
        if self._log is not None:
            self._log.close()
            self._log = None
        if not keep_state and self.state_dir is not None:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> LlamaStackServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
