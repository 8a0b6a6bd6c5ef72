"""What Responses look-ups of ids the gateway does not hold cost every other stream (issue 33,
row 1): a gateway of the ``ogx`` kind keeps ``--kept-mib`` MiB of finished Responses streams
(small deltas, as an engine streams them: many events per MiB); one live Responses stream flows
(a delta every ``--every`` seconds); meanwhile ``--lookups`` requests ask to resume
(``GET /v1/responses/{id}?stream=true``) or cancel (``POST /v1/responses/{id}/cancel``) ids
nobody holds, one after the other. Reported: the live stream's largest gap between two reads
while the look-ups ran and in as long a stretch before them (the machine's own noise), and the
look-ups' latencies. Gateway, server and clients share one process (each server on its own
thread and event loop), as in the tests.

    PYTHONPATH=src python scripts/bench_responses_lookup.py [--kept-mib 40] [--lookups 20]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import statistics
import threading
import time

import httpx2

from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from streamsafe_bench.responses_upstream import ResponsesUpstream, answer_input

_MiB = 1024 * 1024


def fill(url: str, gateway: Gateway, mib: float, deltas: int, size: int) -> int:
    """Finished Responses streams until the gateway keeps ``mib`` MiB of them; how many."""
    made = 0
    with httpx2.Client(timeout=120) as client, concurrent.futures.ThreadPoolExecutor(4) as pool:

        def one(_: int) -> None:
            body = {"model": "m", "input": answer_input(deltas, size), "stream": True}
            r = client.post(url + "/v1/responses", json=body)
            assert r.status_code == 200, r.text[:200]

        while gateway.stats()["kept_bytes"] < mib * _MiB:
            list(pool.map(one, range(4)))
            made += 4
    return made


class LiveStream:
    """One long Responses stream read on a thread; the time of every read."""

    def __init__(self, url: str, every: float) -> None:
        self.reads: list[float] = []
        self._stop = threading.Event()
        body = {"model": "m", "input": answer_input(10**6, 8, every), "stream": True}
        self._thread = threading.Thread(target=self._read, args=(url, body), daemon=True)
        self._thread.start()

    def _read(self, url: str, body: dict[str, object]) -> None:
        with (
            httpx2.Client(timeout=60) as client,
            client.stream("POST", url + "/v1/responses", json=body) as r,
        ):
            for _ in r.iter_raw():
                self.reads.append(time.perf_counter())
                if self._stop.is_set():
                    return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def largest_gap(self, start: float, end: float) -> float:
        """The longest time between two reads from ``start`` to ``end`` (the edges count)."""
        times = [start, *(t for t in self.reads if start < t < end), end]
        return max(b - a for a, b in itertools.pairwise(times))


def lookups(url: str, n: int) -> list[float]:
    """``n`` resume and cancel requests (alternating) for ids nobody holds; their latencies."""
    took = []
    with httpx2.Client(timeout=60) as client:
        for i in range(n):
            t0 = time.perf_counter()
            if i % 2:
                r = client.post(f"{url}/v1/responses/resp_unknown_{i}/cancel")
            else:
                r = client.get(f"{url}/v1/responses/resp_unknown_{i}?stream=true")
            took.append(time.perf_counter() - t0)
            assert r.status_code == 404, (r.status_code, r.text[:200])  # the server's answer
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kept-mib", type=float, default=40.0, help="Responses logs kept (MiB)")
    parser.add_argument("--lookups", type=int, default=20, help="resume/cancel requests")
    parser.add_argument("--every", type=float, default=0.005, help="live stream's delta pace (s)")
    parser.add_argument("--deltas", type=int, default=4000, help="deltas per kept stream")
    parser.add_argument("--size", type=int, default=8, help="bytes per delta")
    args = parser.parse_args()
    upstream = ResponsesUpstream()
    with ServerThread(upstream) as up:
        config = GatewayConfig(upstream=up.url, upstream_kind="ogx", max_kept_bytes=512 * _MiB)
        gateway = Gateway(config)
        with ServerThread(gateway) as gw:
            t0 = time.perf_counter()
            made = fill(gw.url, gateway, args.kept_mib, args.deltas, args.size)
            kept = gateway.stats()["kept_bytes"] / _MiB
            took_s = time.perf_counter() - t0
            print(f"kept: {made} Responses streams, {kept:.1f} MiB ({took_s:.0f} s)")
            live = LiveStream(gw.url, args.every)
            while len(live.reads) < 50:
                time.sleep(0.01)
            quiet_from = time.perf_counter()
            time.sleep(1.0)
            start = time.perf_counter()
            took = lookups(gw.url, args.lookups)
            end = time.perf_counter()
            quiet = live.largest_gap(max(quiet_from, start - (end - start)), start)
            busy = live.largest_gap(start, end)
            live.stop()
    print(
        f"look-ups: {len(took)} in {end - start:.2f} s; latency median"
        f" {statistics.median(took) * 1000:.1f} ms, max {max(took) * 1000:.1f} ms"
    )
    print(f"live stream's largest gap: {busy * 1000:.1f} ms during the look-ups")
    print(f"                           {quiet * 1000:.1f} ms before them (noise)")


if __name__ == "__main__":
    main()
