"""``streamsafe serve --workers N`` above 1: this process binds the port, starts what the workers
share (the engine simulator where no ``--upstream`` is given, a ``redis-server`` where no
``--redis`` is), and supervises them (:class:`~streamsafe.workers.supervisor.Supervisor`)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import secrets
import sys
from collections.abc import Iterator, Mapping

from streamsafe.workers.worker import worker_env

__all__ = ["cores", "supervise", "worker_count"]

log = logging.getLogger("streamsafe.workers")

#: Seconds past a worker's own drain (``--drain-timeout``) it gets before it is killed: the
#: readers' last words (2 s), the server's graceful shutdown (2 s), and room for a busy machine.
_PAST_DRAIN_S = 15.0


def cores() -> int:
    """The cores this process may run on (its affinity, where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - no affinity outside Linux
        return os.cpu_count() or 1


def worker_count(text: str) -> int:
    """``--workers``: a number of at least 1, or ``auto`` (the machine's cores)."""
    if text.strip().lower() == "auto":
        return cores()
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants a number >= 1 or auto, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"wants a number >= 1 or auto, not {text!r}")
    return value


def supervise(args: argparse.Namespace) -> int:
    """Run ``args.workers`` gateways on one port until SIGTERM or Ctrl-C; the exit code."""
    from streamsafe.server import base_url, bind_socket
    from streamsafe.workers.redis_child import NoRedisServer, RedisChild
    from streamsafe.workers.supervisor import Supervisor

    with contextlib.ExitStack() as stack:
        redis_url, secret = args.redis, None
        if redis_url is None:
            try:
                # Started first: no thread of this process may run while it forks.
                redis = stack.enter_context(RedisChild())
            except NoRedisServer as exc:
                print(f"streamsafe serve: {exc}", file=sys.stderr)
                return 2
            redis_url = redis.url
            if not (args.redis_secret or os.environ.get("STREAMSAFE_REDIS_SECRET")):
                secret = secrets.token_urlsafe(32)
        upstream = None
        if not args.upstream:
            upstream = stack.enter_context(_simulator(args))
        sock = stack.enter_context(bind_socket(args.host, args.port))
        host, port = args.host, sock.getsockname()[1]
        url = base_url(host, port, tls=bool(getattr(args, "tls_certfile", None)))
        shared = "Redis at " + ("--redis" if args.redis else "its own redis-server")
        print(
            f"streamsafe gateway on {url}: {args.workers} workers (pid {os.getpid()} supervises; "
            f"{shared})",
            flush=True,
        )

        def env(fd: int, index: int) -> Mapping[str, str]:
            own = redis_url if args.redis is None else None
            return worker_env(fd, index, redis=own, upstream=upstream, secret=secret)

        supervisor = Supervisor(
            # The words it was started with (``streamsafe.cli.main`` keeps them).
            command=[sys.executable, "-m", "streamsafe.cli", *_words(args)],
            sock=sock,
            count=args.workers,
            env=env,
            stop_after=args.drain_timeout + _PAST_DRAIN_S,
        )
        code = supervisor.run()
        log.info("workers drained", extra={"fields": {"event": "workers_drained"}})
        return code
    return 2  # pragma: no cover - mypy: the with block returns


def _words(args: argparse.Namespace) -> list[str]:
    words = getattr(args, "command_line", None)
    return list(sys.argv[1:] if words is None else words)


@contextlib.contextmanager
def _simulator(args: argparse.Namespace) -> Iterator[str]:
    """The engine simulator every worker uses where no ``--upstream`` is given, on a thread of
    the supervisor: one engine behind all of them, as one gateway alone has."""
    from streamsafe.engine_sim import SimConfig, Simulator
    from streamsafe.server import ServerThread

    with ServerThread(Simulator(SimConfig(memory_tokens=args.sim_memory_tokens))) as server:
        print(
            f"streamsafe: no --upstream given; engine simulator running at {server.url}",
            flush=True,
        )
        yield server.url
