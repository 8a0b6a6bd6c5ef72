"""A streamsafe fleet on one machine, started by one command: N gateway replicas sharing one
Redis, behind Debian's nginx.

    python deploy/fleet/run.py --replicas 3 --port 8080 --upstream http://127.0.0.1:8001

Needs ``redis-server`` and ``nginx`` on the PATH or in /usr/sbin (Debian/Ubuntu:
``apt-get install redis-server nginx-light``) and streamsafe installed in this Python. Each
replica is ``streamsafe serve --config deploy/fleet/gateway.toml --redis ... --port ...``; without
``--upstream`` (here or in the config) one engine simulator is started to serve as the engine.

While it runs it prints one line per part and keeps them alive: a replica that dies (killed,
crashed) is started again on its port, and nginx sends new requests to the others meanwhile.
``kill -HUP`` restarts the replicas one at a time without refusing anything: each is taken out
of nginx's upstream list (a reload), drained (SIGTERM: running streams finish), started again
and put back. Ctrl-C or SIGTERM drains every replica, then stops nginx and Redis.

Everything it writes (the nginx configuration, every log) is in ``--workdir`` (default: a new
temporary folder, printed at start).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
_URL = re.compile(r" on (http://[\d.]+:\d+)")


def _binary(name: str) -> str:
    found = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/local/sbin/{name}") if os.access(p, os.X_OK)),
        None,
    )
    if found is None:
        sys.exit(f"fleet: {name} is not installed (Debian/Ubuntu: apt-get install {name})")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(
    check: Callable[[], bool],
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
    timeout: float = 30.0,
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc is not None and proc.poll() is not None:
            sys.exit(f"fleet: {what} exited ({proc.returncode}); see its log")
        if time.monotonic() > deadline:
            sys.exit(f"fleet: {what} did not come up in {timeout:g} s")
        time.sleep(0.05)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class Fleet:
    """The parts and what keeps them running (see the module)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dir = Path(args.workdir or tempfile.mkdtemp(prefix="streamsafe-fleet-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: list[int] = [_free_port() for _ in range(args.replicas)]
        self.out_of_rotation: set[int] = set()
        self.stopping = False
        self.restart_all = False
        self.redis_url = ""
        self.upstreams: list[str] = list(args.upstream or [])

    # -- parts ---------------------------------------------------------------------------------

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = (self.dir / f"{name}.log").open("ab")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
        self.procs[name] = proc
        return proc

    def start_redis(self) -> None:
        port = _free_port()
        cmd = [_binary("redis-server"), "--port", str(port), "--bind", "127.0.0.1"]
        cmd += ["--save", "", "--appendonly", "no", "--dir", str(self.dir)]
        proc = self._spawn("redis", cmd)
        _wait(lambda: _redis_ping(port), "redis-server", proc)
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        print(f"redis on {self.redis_url} (pid {self.procs['redis'].pid})", flush=True)

    def start_engine(self) -> None:
        """The engine simulator, where no engine was named."""
        port = _free_port()
        cmd = [sys.executable, "-m", "streamsafe.cli", "simulate", "--port", str(port)]
        proc = self._spawn("engine", cmd)
        url = f"http://127.0.0.1:{port}"
        _wait(lambda: _http_ok(url + "/health"), "the engine simulator", proc)
        self.upstreams = [url]
        print(f"engine simulator on {url} (pid {self.procs['engine'].pid})", flush=True)

    def start_replica(self, i: int) -> None:
        port = self.ports[i]
        cmd = [sys.executable, "-m", "streamsafe.cli", "serve", "--config", self.args.config]
        cmd += ["--redis", self.redis_url, "--host", "127.0.0.1", "--port", str(port)]
        for url in self.upstreams:
            cmd += ["--upstream", url]
        proc = self._spawn(f"replica-{i}", cmd)
        _wait(lambda: _http_ok(f"http://127.0.0.1:{port}/health"), f"replica {i}", proc)
        print(f"replica {i} on http://127.0.0.1:{port} (pid {proc.pid})", flush=True)

    def write_nginx_conf(self) -> Path:
        servers = "\n".join(
            f"        server 127.0.0.1:{port} max_fails=1 fail_timeout=2s;"
            + ("  # out of rotation" if i in self.out_of_rotation else "")
            for i, port in enumerate(self.ports)
            if i not in self.out_of_rotation
        )
        text = (HERE / "nginx.conf.in").read_text()
        text = text.replace("@PREFIX@", str(self.dir)).replace("@SERVERS@", servers)
        text = text.replace("@LISTEN@", f"{self.args.host}:{self.args.port}")
        conf = self.dir / "nginx.conf"
        conf.write_text(text)
        return conf

    def start_nginx(self) -> None:
        conf = self.write_nginx_conf()
        exe = _binary("nginx")
        self.nginx_cmd = [
            exe,
            "-p",
            f"{self.dir}/",
            "-c",
            str(conf),
            "-e",
            f"{self.dir}/nginx-error.log",
        ]
        proc = self._spawn("nginx", self.nginx_cmd)
        url = f"http://{self.args.host}:{self.args.port}"
        _wait(lambda: _http_ok(url + "/health"), "nginx", proc)
        print(f"nginx on {url} (pid {proc.pid})", flush=True)

    def reload_nginx(self) -> None:
        self.write_nginx_conf()
        subprocess.run([*self.nginx_cmd, "-s", "reload"], check=True, capture_output=True)
        time.sleep(0.5)  # the new workers take over; the old ones finish their streams

    # -- running -------------------------------------------------------------------------------

    def start(self) -> None:
        print(f"fleet: every file in {self.dir}", flush=True)
        self.start_redis()
        if not self.upstreams and not _config_names_upstream(self.args.config):
            self.start_engine()
        for i in range(self.args.replicas):
            self.start_replica(i)
        self.start_nginx()
        print(
            f"fleet ready on http://{self.args.host}:{self.args.port}: "
            f"{self.args.replicas} replicas, one Redis, nginx",
            flush=True,
        )

    def watch(self) -> None:
        """Keep the replicas running until told to stop; restart them on SIGHUP."""
        while not self.stopping:
            if self.restart_all:
                self.restart_all = False
                self.rolling_restart()
            for i in range(self.args.replicas):
                proc = self.procs[f"replica-{i}"]
                if proc.poll() is not None and not self.stopping:
                    print(f"replica {i} exited ({proc.returncode}); starting it again", flush=True)
                    self.start_replica(i)
            time.sleep(0.2)

    def rolling_restart(self) -> None:
        for i in range(self.args.replicas):
            self.out_of_rotation = {i}
            self.reload_nginx()
            proc = self.procs[f"replica-{i}"]
            proc.send_signal(signal.SIGTERM)  # drain: running streams finish
            try:
                proc.wait(self.args.drain_wait)
            except subprocess.TimeoutExpired:
                print(
                    f"replica {i} did not stop within {self.args.drain_wait} s; killed", flush=True
                )
                proc.kill()
                proc.wait()
            self.start_replica(i)
            self.out_of_rotation = set()
            self.reload_nginx()
        print("rolling restart done", flush=True)

    def stop(self) -> None:
        """Drain every replica at once, then stop nginx, the engine and Redis."""
        replicas = [p for n, p in self.procs.items() if n.startswith("replica-")]
        for proc in replicas:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in replicas:
            try:
                proc.wait(self.args.drain_wait)
            except subprocess.TimeoutExpired:
                proc.kill()
        for name in ("nginx", "engine", "redis"):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGQUIT if name == "nginx" else signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        print("fleet stopped", flush=True)


def _config_names_upstream(path: str) -> bool:
    import tomllib

    with open(path, "rb") as f:
        return bool(tomllib.load(f).get("upstream"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="deploy/fleet/run.py", description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=3, help="gateway replicas (default 3)")
    ap.add_argument("--host", default="127.0.0.1", help="address nginx listens on")
    ap.add_argument("--port", type=int, default=8080, help="port nginx listens on (default 8080)")
    ap.add_argument(
        "--upstream",
        action="append",
        help="engine URL for every replica, repeatable (replaces the config's list; none "
        "there either: an engine simulator is started)",
    )
    ap.add_argument(
        "--config",
        default=str(HERE / "gateway.toml"),
        help="the replicas' settings (default deploy/fleet/gateway.toml)",
    )
    ap.add_argument("--workdir", default=None, help="where configuration and logs go")
    ap.add_argument(
        "--drain-wait",
        type=float,
        default=40.0,
        help="seconds a replica gets to drain at the end before it is killed (default 40)",
    )
    args = ap.parse_args(argv)
    fleet = Fleet(args)

    def stop(_sig: int, _frame: object) -> None:
        fleet.stopping = True

    def restart(_sig: int, _frame: object) -> None:
        fleet.restart_all = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, restart)
    try:
        fleet.start()
        fleet.watch()
    finally:
        fleet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
