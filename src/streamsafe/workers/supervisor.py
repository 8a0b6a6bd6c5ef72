"""The supervisor: N worker processes on one listening socket, each replaced when it dies, all
drained on SIGTERM or Ctrl-C.

It does no I/O of the gateway's and runs no event loop: one thread that polls its children
every 50 ms (nothing next to the seconds a replacement or a drain takes) and reacts to signals.

- A worker that dies is replaced, after :class:`~streamsafe.workers.restart.RestartBackoff`'s
  wait. One that exits with status 2 refused its options (every worker would): the supervisor
  stops the others and exits 2 instead of restarting it.
- The first SIGTERM or SIGINT is passed to every worker as SIGTERM: each drains as a gateway
  alone does (``--drain-timeout``, then its last words) and exits; the supervisor exits once all
  have, 0 where every one exited 0. A second signal is passed on too (a worker then stops at
  once, uvicorn's way); a worker still there ``stop_after`` seconds after the first is killed.
- Workers run in their own process group: a Ctrl-C at the terminal reaches the supervisor
  alone, so each worker gets one signal, and drains, instead of two.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType

from streamsafe.workers.restart import RestartBackoff

__all__ = ["Supervisor"]

log = logging.getLogger("streamsafe.workers")

#: Exit status of a worker whose options were refused (the command line's usage error).
_REFUSED = 2
_POLL_S = 0.05


@dataclass
class _Slot:
    """One worker's place: its process, and when its replacement is due."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    due: float | None = 0.0
    starts: int = 0


@dataclass
class Supervisor:
    """Runs ``count`` copies of ``command``, each inheriting ``sock`` and given ``env(fd,
    index)`` on top of this process's environment, until a signal and their drain."""

    command: Sequence[str]
    sock: socket.socket
    count: int
    env: Callable[[int, int], Mapping[str, str]]
    #: Seconds the workers get, after the first signal, before they are killed.
    stop_after: float = 60.0
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    clock: Callable[[], float] = time.monotonic
    _slots: list[_Slot] = field(default_factory=list)
    _deaths: list[float] = field(default_factory=list)
    _signals: list[int] = field(default_factory=list)
    _forwarded: int = 0
    _stop_by: float | None = None
    _refused: bool = False
    _drained: list[int] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        """The workers' pids, now."""
        return [s.proc.pid for s in self._slots if s.proc is not None and s.proc.poll() is None]

    def run(self) -> int:
        """Supervise until the workers are drained; the exit status."""
        self._slots = [_Slot(i + 1) for i in range(self.count)]
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            while True:
                self._pass_signals()
                self._reap()
                if self._stop_by is not None:
                    if not self.pids:
                        break
                    if self.clock() > self._stop_by:
                        self._kill_rest()
                else:
                    self._start_due()
                time.sleep(_POLL_S)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self._refused:
            return _REFUSED
        return 0 if all(code == 0 for code in self._drained) else 1

    def stop(self) -> None:
        """Drain the workers and end :meth:`run` (as a SIGTERM would)."""
        self._signals.append(signal.SIGTERM)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self._signals.append(sig)

    def _pass_signals(self) -> None:
        while self._forwarded < len(self._signals):
            sig = self._signals[self._forwarded]
            self._forwarded += 1
            if self._stop_by is None:
                self._stop_by = self.clock() + self.stop_after
                log.warning(
                    "%s: draining %d worker(s)",
                    signal.Signals(sig).name,
                    len(self.pids),
                    extra={"fields": {"event": "workers_draining", "workers": len(self.pids)}},
                )
            for pid in self.pids:
                _send(pid, signal.SIGTERM)

    def _reap(self) -> None:
        now = self.clock()
        for slot in self._slots:
            proc = slot.proc
            if proc is None or proc.poll() is None:
                continue
            slot.proc = None
            code = proc.returncode
            if self._stop_by is not None:
                log.info(
                    "worker %d (pid %d) exited (%s)",
                    slot.index,
                    proc.pid,
                    _how(code),
                    extra={"fields": {"event": "worker_exited", "worker": slot.index}},
                )
                # One killed by the SIGTERM itself was still starting: uvicorn puts the drain
                # on the signal before its first accept, so it never served, and lost nothing.
                self._drained.append(0 if code == -signal.SIGTERM else code)
                slot.due = None
                continue
            if code == _REFUSED:
                log.error(
                    "worker %d (pid %d) refused its options: stopping the others",
                    slot.index,
                    proc.pid,
                    extra={"fields": {"event": "worker_refused", "worker": slot.index}},
                )
                self._refused = True
                slot.due = None
                self.stop()
                continue
            self._deaths.append(now)
            self.backoff.forget(self._deaths, now)
            wait = self.backoff.delay(self._deaths, now)
            slot.due = now + wait
            log.warning(
                "worker %d (pid %d) died (%s); a new one in %.1f s",
                slot.index,
                proc.pid,
                _how(code),
                wait,
                extra={
                    "fields": {
                        "event": "worker_died",
                        "worker": slot.index,
                        "status": code,
                        "restart_in_s": wait,
                    }
                },
            )

    def _start_due(self) -> None:
        now = self.clock()
        for slot in self._slots:
            if slot.proc is None and slot.due is not None and now >= slot.due:
                self._start(slot)

    def _start(self, slot: _Slot) -> None:
        fd = self.sock.fileno()
        env = {**os.environ, **self.env(fd, slot.index)}
        slot.proc = subprocess.Popen(list(self.command), env=env, pass_fds=(fd,), process_group=0)
        slot.due = None
        slot.starts += 1
        if slot.starts > 1:
            log.info(
                "worker %d replaced (pid %d)",
                slot.index,
                slot.proc.pid,
                extra={"fields": {"event": "worker_replaced", "worker": slot.index}},
            )

    def _kill_rest(self) -> None:
        for pid in self.pids:
            log.warning(
                "worker pid %d still running %g s after the drain began: killed",
                pid,
                self.stop_after,
                extra={"fields": {"event": "worker_killed"}},
            )
            _send(pid, signal.SIGKILL)


def _send(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it exited since it was polled
        os.kill(pid, sig)


def _how(code: int | None) -> str:
    if code is None:
        return "running"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"status {code}"
