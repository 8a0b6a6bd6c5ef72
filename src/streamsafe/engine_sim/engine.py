"""The simulated engine: one asyncio task steps every running generation, as vLLM's engine loop
does, and accounts for memory in tokens.

Model, per step: requests waiting in FIFO order are scheduled while fewer than ``max_num_seqs``
run; the step takes ``itl_ms + itl_ms_per_seq * running`` plus ``prefill_ms_per_token`` times the
prompt tokens of the requests scheduled in it; at its end every running generation gets one token.
Memory: a waiting generation holds its prompt tokens, a running one its prompt plus its generated
tokens. When the memory held would pass capacity (on admission or on a step) the engine dies: every
live generation fails and every later submission is refused until :meth:`Engine.restart`.

Handlers never poll: each generation (:mod:`~.generation`) has at most one waiter future, resolved
by the step that gives it a token or by its end, so a stream costs one wake-up per step however
many tokens it is behind. All mutation happens on the event loop; a lock makes :meth:`Engine.stats`
and :meth:`Engine.memory_series` safe from other threads (taken once per step, never per token).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import deque
from typing import Any

from streamsafe.engine_sim.config import SimConfig
from streamsafe.engine_sim.generation import TERMINAL, Generation, GenState

__all__ = ["Engine", "EngineDeadError"]


class EngineDeadError(RuntimeError):
    """The engine is dead (it ran out of memory); the message is the one vLLM reports."""


def _dead_message(cause: str) -> str:
    return (
        "EngineDeadError: Engine loop is not running. Inspect the stacktrace to find the "
        f"original error: {cause}"
    )


class Engine:
    """The engine loop and its accounting; see the module text for the model."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, Generation] = {}
        self._running: dict[int, Generation] = {}
        self._used = 0
        self._dead = False
        self._dead_message = ""
        self._c: dict[str, int] = dict.fromkeys(
            (
                "requests_received",
                "embeddings",
                "form_bytes_received",
                "generations_started",
                "continuations",
                "generations_completed",
                "generations_aborted",
                "generations_failed",
                "peak_active",
                "memory_peak_tokens",
                "crashes",
                "restarts",
                "tokens_generated",
                "tokens_unread",
                "steps",
                "faults_status",
                "faults_errorevent",
                "faults_cut",
                "faults_stall",
                "faults_pause",
                "faults_reset",
                "faults_hang",
                "faults_malformed",
                "faults_nodone",
                "faults_blackhole",
                "faults_crash",
                "faults_flap",
                "refused_prefill",
                "refused_context_length",
            ),
            0,
        )
        self._by_model: dict[str, int] = {}
        self._t0 = time.monotonic()
        self._series: deque[tuple[float, int]] = deque(maxlen=config.series_max_points)
        self._series_last = -1e9
        self._series.append((0.0, 0))
        self._wake_loop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """True while the engine task runs on some loop."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the engine task on the running loop (idempotent)."""
        if self.started:
            return
        self.loop = asyncio.get_running_loop()
        self._wake_loop = asyncio.Event()
        self._task = self.loop.create_task(self._run(), name="engine-sim")

    async def stop(self) -> None:
        """Stop the engine task; live generations fail (the server is going away)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with self._lock:
            self._fail_all("EngineDeadError: the server is shutting down")

    # -- requests ----------------------------------------------------------------------------

    @property
    def dead(self) -> bool:
        """True from a crash until :meth:`restart`."""
        return self._dead

    @property
    def dead_message(self) -> str:
        """The error message a dead engine gives."""
        return self._dead_message

    def count(self, key: str, n: int = 1) -> None:
        """Add ``n`` to counter ``key`` (requests_received, faults_status, ...)."""
        with self._lock:
            self._c[key] += n

    def count_model(self, model: str) -> None:
        """One more completion request naming ``model`` (served or not)."""
        with self._lock:
            self._by_model[model] = self._by_model.get(model, 0) + 1

    def crash(self, cause: str) -> None:
        """Die now, as from an internal error (``cause`` ends the message): every live
        generation fails and every later request is refused until :meth:`restart`."""
        with self._lock:
            if not self._dead:
                self._die(_dead_message(cause))

    def submit(
        self, prompt_tokens: int, max_tokens: int, *, continuation: bool = False
    ) -> Generation:
        """Admit a generation to the waiting queue; raise EngineDeadError if the engine is dead
        or dies of this admission. ``continuation``: it continues a partial answer
        (``continue_final_message``); counted apart, since it repeats no generated token."""
        with self._lock:
            if self._dead:
                raise EngineDeadError(self._dead_message)
            needed = self._used + prompt_tokens
            if needed > self.config.memory_tokens:
                self._run_out(needed)
                raise EngineDeadError(self._dead_message)
            gen = Generation(next(self._ids), prompt_tokens, max_tokens)
            self._used = needed
            self._waiting[gen.id] = gen
            self._c["generations_started"] += 1
            if continuation:
                self._c["continuations"] += 1
            self._note_memory()
        if self._wake_loop is not None:
            self._wake_loop.set()
        return gen

    def client_gone(self, gen: Generation) -> None:
        """The client of ``gen`` vanished: abort it (freeing its memory) or, without
        abort-on-disconnect, let it run on for nobody."""
        with self._lock:
            if gen.state in TERMINAL or gen.detached:
                return
            self._c["tokens_unread"] += gen.generated - gen.sent
            if self.config.abort_on_disconnect:
                self._waiting.pop(gen.id, None)
                self._running.pop(gen.id, None)
                self._used -= gen.prompt_tokens + gen.generated
                gen.state = GenState.ABORTED
                self._c["generations_aborted"] += 1
                self._note_memory()
            else:
                gen.detached = True
        gen.wake()

    def restart(self) -> None:
        """Revive the engine (call on its loop): live generations fail, memory empties."""
        with self._lock:
            self._fail_all("EngineDeadError: the engine was restarted")
            self._dead = False
            self._dead_message = ""
            self._used = 0
            self._c["restarts"] += 1
            self._note_memory(force=True)
        if self._wake_loop is not None:
            self._wake_loop.set()

    # -- observation -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """A consistent snapshot of the counters (safe from any thread)."""
        with self._lock:
            c = self._c
            return {
                "requests_received": c["requests_received"],
                "embeddings": c["embeddings"],
                "form_bytes_received": c["form_bytes_received"],
                "generations_started": c["generations_started"],
                "continuations": c["continuations"],
                "generations_completed": c["generations_completed"],
                "generations_aborted": c["generations_aborted"],
                "generations_failed": c["generations_failed"],
                "active": len(self._running),
                "waiting": len(self._waiting),
                "peak_active": c["peak_active"],
                "memory_used_tokens": self._used,
                "memory_peak_tokens": c["memory_peak_tokens"],
                "memory_capacity_tokens": self.config.memory_tokens,
                "engine_dead": self._dead,
                "crashes": c["crashes"],
                "restarts": c["restarts"],
                "tokens_generated": c["tokens_generated"],
                "tokens_unread": c["tokens_unread"],
                "steps": c["steps"],
                "faults_injected": {
                    "status": c["faults_status"],
                    "errorevent": c["faults_errorevent"],
                    "cut": c["faults_cut"],
                    "stall": c["faults_stall"],
                    "pause": c["faults_pause"],
                    "reset": c["faults_reset"],
                    "hang": c["faults_hang"],
                    "malformed": c["faults_malformed"],
                    "nodone": c["faults_nodone"],
                    "blackhole": c["faults_blackhole"],
                    "crash": c["faults_crash"],
                    "flap": c["faults_flap"],
                },
                "requests_by_model": dict(self._by_model),
                "refused_prefill": c["refused_prefill"],
                "refused_context_length": c["refused_context_length"],
                "uptime_s": round(time.monotonic() - self._t0, 3),
            }

    def memory_series(self) -> list[tuple[float, int]]:
        """(seconds since start, tokens in use), one point per ``series_interval_s`` at most,
        plus every crash and restart (safe from any thread)."""
        with self._lock:
            return list(self._series)

    # -- inside the lock ---------------------------------------------------------------------

    def _note_memory(self, force: bool = False) -> None:
        used = self._used
        if used > self._c["memory_peak_tokens"]:
            self._c["memory_peak_tokens"] = used
        now = time.monotonic() - self._t0
        if force or now - self._series_last >= self.config.series_interval_s:
            self._series_last = now
            self._series.append((round(now, 4), used))

    def _fail_all(self, message: str) -> None:
        for table in (self._waiting, self._running):
            for gen in table.values():
                gen.state = GenState.FAILED
                gen.error = message
                self._c["generations_failed"] += 1
                gen.wake()
            table.clear()

    def _run_out(self, needed: int) -> None:
        capacity = self.config.memory_tokens
        self._die(_dead_message(f"OutOfResources({needed}, {capacity}, 'shared memory')"))

    def _die(self, message: str) -> None:
        self._dead = True
        self._dead_message = message
        self._c["crashes"] += 1
        self._note_memory(force=True)
        self._fail_all(self._dead_message)
        self._used = 0
        self._note_memory(force=True)

    # -- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._wake_loop is not None and self.loop is not None
        loop, wake, cfg = self.loop, self._wake_loop, self.config
        next_t = loop.time()
        while True:
            if self._dead or not (self._waiting or self._running):
                wake.clear()
                if self._dead or not (self._waiting or self._running):
                    await wake.wait()
                next_t = loop.time()
                continue
            n, prefill = self.schedule()
            step = cfg.itl_ms + cfg.itl_ms_per_seq * n + cfg.prefill_ms_per_token * prefill
            # Absolute deadlines keep the average step exact despite timer granularity; a late
            # step does not make the next ones burst to catch up.
            next_t += step / 1000.0
            delay = next_t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                next_t = loop.time()
                await asyncio.sleep(0)
            self.step()

    def schedule(self) -> tuple[int, int]:
        """Move waiting generations to running (FIFO, up to ``max_num_seqs``); return (running,
        prompt tokens scheduled now). The loop calls this before each step's delay; tests may
        drive :meth:`schedule` and :meth:`step` by hand on an engine never started."""
        prefill = 0
        with self._lock:
            waiting, running = self._waiting, self._running
            if self._dead:
                return 0, 0
            while waiting and len(running) < self.config.max_num_seqs:
                gen = waiting.pop(next(iter(waiting)))
                gen.state = GenState.RUNNING
                running[gen.id] = gen
                prefill += gen.prompt_tokens
            n = len(running)
            if n > self._c["peak_active"]:
                self._c["peak_active"] = n
        return n, prefill

    def step(self) -> None:
        """End of a decode step: one token for every running generation, or death if the
        memory that needs would pass capacity."""
        running = self._running
        with self._lock:
            n = len(running)
            if self._dead or not n:
                return
            needed = self._used + n
            if needed > self.config.memory_tokens:
                self._run_out(needed)
                return
            self._used = needed
            c = self._c
            if needed > c["memory_peak_tokens"]:  # held at this instant, before frees below
                c["memory_peak_tokens"] = needed
            c["tokens_generated"] += n
            c["steps"] += 1
            finished: list[Generation] = []
            unread = 0
            for gen in running.values():
                g = gen.generated + 1
                gen.generated = g
                if gen.detached:
                    unread += 1
                if g >= gen.max_tokens:
                    finished.append(gen)
                fut = gen.waiter
                if fut is not None:
                    gen.waiter = None
                    if not fut.done():
                        fut.set_result(None)
            c["tokens_unread"] += unread
            for gen in finished:
                del running[gen.id]
                self._used -= gen.prompt_tokens + gen.generated
                gen.state = GenState.DONE
            c["generations_completed"] += len(finished)
            self._note_memory()
