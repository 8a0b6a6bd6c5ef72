"""``streamsafe bench NAME``: each benchmark registers itself here.

Every benchmark measures streamsafe against a peer in the same run and reports ratios; these
machines are noisy, so absolute figures mean little.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from streamsafe_bench.report import OUTPUTS

# (name, module exposing register(subparsers)).
_BENCHES: tuple[tuple[str, str], ...] = (
    ("sse", "streamsafe_bench.sse"),
    ("client", "streamsafe_bench.client"),
    ("simulator", "streamsafe_bench.simulator"),
    ("overhead", "streamsafe_bench.overhead"),
    ("overload", "streamsafe_bench.overload"),
    ("peers", "streamsafe_bench.peers"),
    ("relay", "streamsafe_bench.relay"),
    ("fleet", "streamsafe_bench.fleet"),
    ("workers", "streamsafe_bench.workers"),
    ("vllm", "streamsafe_bench.vllm_cost"),
)


def _available() -> list[tuple[str, Any]]:
    found = []
    for name, module in _BENCHES:
        try:
            found.append((name, importlib.import_module(module)))
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    return found


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks against real peers, as ratios")
    sub = parser.add_subparsers(dest="bench", metavar="BENCH")
    mods = _available()
    for _name, mod in mods:
        mod.register(sub)
    names = [name for name, _mod in mods]
    allp = sub.add_parser("all", help="run every benchmark with its defaults")
    allp.add_argument("--out", default="reports", help="folder for the reports (default reports)")
    allp.set_defaults(func=lambda args: _run_all(args, sub, names))
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def _run_all(args: argparse.Namespace, sub: Any, names: list[str]) -> int:
    """Each benchmark with its own defaults, its outputs named ``OUT/bench-NAME.EXT``."""
    rc = 0
    for name in names:
        print(f"== bench {name} ==", flush=True)
        parser = sub.choices[name]
        argv = []
        for flag in parser.get_default("outputs"):
            argv += [f"--{flag}", f"{args.out}/bench-{name}.{OUTPUTS[flag]}"]
        bench_args = parser.parse_args(argv)
        rc |= int(bench_args.func(bench_args) or 0)
    return rc
