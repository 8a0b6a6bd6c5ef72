"""The real vLLM as a process on loopback, serving the tiny model, for tests and the demo.

:class:`VLLMEngine` starts ``vllm serve`` from the project's vLLM virtualenv (``.venv-vllm``,
built by ``make vllm``; see docs/vllm.md) on a free loopback port, waits until ``/health``
answers 200, and stops it. The model is :mod:`streamsafe_bench.tiny_model`'s, built into
``.venv-vllm/models`` on first use. vLLM's output goes to a log file, which is also how the
tests count what vLLM did: with ``--enable-log-requests`` its API server logs a line for each
request it received (:data:`RECEIVED`) and one for each request it aborted because the client
left (:data:`ABORTED`); ``/metrics`` counts neither aborts nor refused requests.

vLLM runs as three processes: the API server (:attr:`VLLMEngine.pid`), its ``EngineCore``
child, which schedules, and that one's ``Worker`` child, which computes.
:meth:`VLLMEngine.pause` stops the engine core and its worker (SIGSTOP) while the API server
keeps accepting and logging requests: a stalled engine as a long prefill or a stuck step makes
one, which is what a gateway in front must hide. :meth:`VLLMEngine.resume` continues them.

On this machine's 2 cores vLLM takes 26-58 s to start and holds about 2 GiB: start it once per
test session or demo run.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from streamsafe_bench import tiny_model
from streamsafe_bench.processes import free_port, process_tree

__all__ = [
    "ABORTED",
    "RECEIVED",
    "VLLMEngine",
    "VLLMOptions",
    "VLLMUnavailable",
    "find_venv",
]

#: The line vLLM 0.32's API server logs (``vllm/entrypoints/serve/utils/request_logger.py``, with
#: ``--enable-log-requests``) for each generation request it received, before the engine sees
#: it: ``Received request chatcmpl-5f0c...: params: SamplingParams(...)``. A request refused with
#: a 503 status by ``--max-num-queued-reqs`` is not logged (that check runs before the line); one
#: that passed it and was refused when added to the engine (a 200 whose first event is the 503
#: error) is. ``/tokenize`` requests (ids ``tokenize-...``) are not counted: they generate
#: nothing.
RECEIVED = re.compile(r"Received request (?!tokenize-)(\S+): params: ")
#: The line vLLM 0.32 logs (``vllm/v1/engine/async_llm.py``) when a request's generation was
#: cancelled because its client left: ``Request chatcmpl-5f0c... aborted.``
ABORTED = re.compile(r"Request (\S+) aborted\.")

#: The environment variable naming the vLLM virtualenv (default: ``.venv-vllm`` at the top of
#: the checkout this module runs from).
VENV_VARIABLE = "STREAMSAFE_VLLM_VENV"


class VLLMUnavailable(RuntimeError):
    """The vLLM virtualenv is not there: ``make vllm`` builds it."""


def find_venv() -> Path:
    """The vLLM virtualenv: ``$STREAMSAFE_VLLM_VENV``, or ``.venv-vllm`` at the top of the
    checkout (``benchmarks/src/streamsafe_bench`` is three folders below it). Raises
    :class:`VLLMUnavailable` where its ``vllm`` command is missing."""
    named = os.environ.get(VENV_VARIABLE)
    venv = Path(named) if named else Path(__file__).resolve().parents[3] / ".venv-vllm"
    if not (venv / "bin" / "vllm").exists():
        raise VLLMUnavailable(f"no vLLM at {venv}: `make vllm` builds it (see docs/vllm.md)")
    return venv


@dataclass(frozen=True)
class VLLMOptions:
    """How ``vllm serve`` is started; every field has the value the tests use by default."""

    #: ``--max-model-len``: prompt plus answer, in tokens.
    max_model_len: int = 1024
    #: ``--max-num-seqs``: requests in one batch; more wait in vLLM's queue.
    max_num_seqs: int = 8
    #: ``--num-gpu-blocks-override``: the KV cache in blocks (16 tokens each on the CPU), or
    #: ``None`` for ``kv_cache_gib``. A small cache makes vLLM preempt and recompute.
    kv_cache_blocks: int | None = None
    #: ``VLLM_CPU_KVCACHE_SPACE`` in GiB, where ``kv_cache_blocks`` is ``None``: 1 GiB holds
    #: half a million of the tiny model's tokens (2 KiB each), more than any test asks.
    kv_cache_gib: int = 1
    #: ``--chat-template``: ``"plain"`` (the model's own) or ``"trim"`` (Llama 3's trimming of
    #: each message, :data:`streamsafe_bench.tiny_model.TRIM_TEMPLATE`). A request may name
    #: another in its body: the server runs with ``--trust-request-chat-template``.
    chat_template: str = "plain"
    #: Any other ``vllm serve`` arguments, e.g. ``("--max-num-queued-reqs", "2")`` or
    #: ``("--stream-interval", "5")``.
    extra_args: tuple[str, ...] = ()
    #: Seconds to wait for ``/health`` (a start takes 26-58 s on 2 busy cores).
    start_timeout: float = 240.0


class VLLMEngine:
    """vLLM 0.32 serving the tiny model on a free loopback port.

    >>> with VLLMEngine() as vllm:
    ...     httpx2.post(vllm.url + "/v1/chat/completions", json={...})
    ...     vllm.requests_received()

    ``start()`` builds the model if it is not built yet, starts the server and returns once
    ``/health`` answers 200, recording how long that took in ``startup_s``. ``stop()`` resumes
    a paused engine, terminates the server (SIGTERM, then SIGKILL for every process of its tree
    still there after 20 s) and removes its temporary folder unless told to keep it.
    """

    def __init__(self, options: VLLMOptions | None = None, *, venv: Path | None = None) -> None:
        self.options = options or VLLMOptions()
        self.venv = venv or find_venv()
        self.model = tiny_model.MODEL_NAME
        self.port = 0
        self.startup_s: float | None = None
        self.state_dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self._paused: list[int] = []
        self._pause_lock = threading.Lock()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:41234`` (the OpenAI routes live under ``/v1``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def model_dir(self) -> Path:
        """The tiny model's folder (built on first use)."""
        return self.venv / "models" / tiny_model.folder_name()

    @property
    def log_path(self) -> Path:
        """Where the server's stdout and stderr go."""
        assert self.state_dir is not None, "not started"
        return self.state_dir / "vllm.log"

    @property
    def pid(self) -> int | None:
        """The API server's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def command(self) -> list[str]:
        """The ``vllm serve`` command line."""
        o = self.options
        cmd = [
            str(self.venv / "bin" / "vllm"),
            "serve",
            str(self.model_dir),
            "--served-model-name",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "--enforce-eager",
            "--max-model-len",
            str(o.max_model_len),
            "--max-num-seqs",
            str(o.max_num_seqs),
            "--enable-log-requests",
            "--trust-request-chat-template",
            "--chat-template",
            str(self.model_dir / f"{o.chat_template}_template.jinja"),
            "--seed",
            "0",
        ]
        if o.kv_cache_blocks is not None:
            cmd += ["--num-gpu-blocks-override", str(o.kv_cache_blocks)]
        return cmd + list(o.extra_args)

    def start(self) -> VLLMEngine:
        """Build the model if needed, start the server, wait for ``/health``."""
        tiny_model.ensure_built(self.model_dir.parent, str(self.venv / "bin" / "python"))
        self.state_dir = Path(tempfile.mkdtemp(prefix="streamsafe-vllm-"))
        t0 = time.monotonic()
        deadline = t0 + self.options.start_timeout
        for attempt in range(5):
            self.port = free_port()
            try:
                self._launch()
                if self._wait_healthy(deadline):
                    self.startup_s = time.monotonic() - t0
                    return self
            except BaseException:
                self.stop(keep_state=True)
                raise
            # Another process took the free port between choosing it and vLLM binding it.
            self.stop(keep_state=True)
            if attempt == 4:
                raise RuntimeError(f"vLLM could not bind a port:\n{self.log_tail()}")
        raise AssertionError("unreachable")

    def _launch(self) -> None:
        env = dict(os.environ)
        env.update(
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            VLLM_CPU_KVCACHE_SPACE=str(self.options.kv_cache_gib),
            VLLM_CACHE_ROOT=str(self.venv / "cache"),  # not the user's ~/.cache/vllm
            VLLM_NO_USAGE_STATS="1",
            VLLM_DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
        )
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop())
        self._proc = subprocess.Popen(
            self.command(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def _wait_healthy(self, deadline: float) -> bool:
        """True once ``/health`` answers 200; False where the port was taken."""
        assert self._proc is not None
        with httpx2.Client(trust_env=False, timeout=2.0) as client:
            while True:
                if self._proc.poll() is not None:
                    if "address already in use" in self.log_tail(20).lower():
                        return False
                    raise RuntimeError(
                        f"vLLM exited with {self._proc.returncode} before it was healthy; its "
                        f"log ({self.log_path}) ends with:\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx2.TransportError):
                    if client.get(self.url + "/health").status_code == 200:
                        return True
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"vLLM was not healthy within {self.options.start_timeout} s; its log "
                        f"({self.log_path}) ends with:\n{self.log_tail()}"
                    )
                time.sleep(0.2)

    def log_text(self) -> str:
        """Everything the server has logged so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except (OSError, AssertionError):
            return ""

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's output (for failure messages)."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def requests_received(self, *, seed: int | None = None) -> list[str]:
        """The ids of the generation requests vLLM received so far, in order (:data:`RECEIVED`).

        With ``seed``, only those whose sampling parameters carry that ``seed``: a test tags its
        requests with a seed of its own (greedy requests ignore it) and counts them alone,
        whatever else the shared server received."""
        tag = None if seed is None else f" seed={seed},"
        return [
            match.group(1)
            for line in self.log_text().splitlines()
            if (match := RECEIVED.search(line)) and (tag is None or tag in line)
        ]

    def requests_aborted(self) -> list[str]:
        """The ids of the requests vLLM aborted because their client left (:data:`ABORTED`)."""
        return ABORTED.findall(self.log_text())

    def preemptions(self) -> int:
        """How many times the scheduler preempted a request for KV-cache room (``/metrics``)."""
        text = httpx2.get(self.url + "/metrics", timeout=5.0, trust_env=False).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith("vllm:num_preemptions_total"):
                total += float(line.rsplit(" ", 1)[1])
        return int(total)

    def engine_core_pid(self) -> int:
        """The ``EngineCore`` process (the scheduler; its ``Worker`` child computes)."""
        assert self._proc is not None, "not started"
        for pid in process_tree(self._proc.pid):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"VLLM::EngineCore"):
                    return pid
        raise RuntimeError("vLLM has no EngineCore process")

    def pause(self) -> None:
        """Stop the engine core and its worker (SIGSTOP): requests are still received and
        logged, nothing is generated until :meth:`resume`. Returns once they are stopped."""
        self._stop(lambda: process_tree(self.engine_core_pid()))

    def freeze(self) -> None:
        """Stop every process of vLLM, its API server too (SIGSTOP): the kernel still accepts
        connections, nothing answers, ``/health`` included (a frozen host). :meth:`resume`
        continues it."""
        assert self._proc is not None, "not started"
        proc = self._proc
        self._stop(lambda: process_tree(proc.pid))

    def _stop(self, pids: Callable[[], list[int]]) -> None:
        with self._pause_lock:
            if self._paused:
                return
            self._paused = pids()
            for pid in self._paused:
                os.kill(pid, signal.SIGSTOP)
            # A signal is delivered when the process is next scheduled: on busy cores that may
            # be a while. Return once every one of them is stopped, so nothing runs after this.
            deadline = time.monotonic() + 10.0
            while not all(_stopped(pid) for pid in self._paused):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vLLM did not stop: {self._paused}")
                time.sleep(0.005)

    def resume(self) -> None:
        """Continue what :meth:`pause` stopped (nothing if it is not paused)."""
        with self._pause_lock:
            paused, self._paused = self._paused, []
            for pid in paused:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def stall(self, seconds: float) -> threading.Thread:
        """Pause now and resume after ``seconds`` on a thread, returned started: join it.
        (:meth:`stop` resumes too, so a test that fails before joining leaves no stopped
        process behind.)"""
        self.pause()
        timer = threading.Timer(seconds, self.resume)
        timer.daemon = True
        timer.start()
        return timer

    def stop(self, *, keep_state: bool = False) -> None:
        """Stop the server (and any of its processes left) and remove its temporary folder
        (kept with ``keep_state``, so a failed start can still be read)."""
        self.resume()
        proc, self._proc = self._proc, None
        if proc is not None:
            tree = process_tree(proc.pid)
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            for pid in tree[1:]:  # an engine core whose server was killed before it
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"VLLM::"):
                        os.kill(pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None
        if not keep_state and self.state_dir is not None:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> VLLMEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stopped(pid: int) -> bool:
    """The process is stopped by a signal, or gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")
