"""The streaming load the shared-store scripts measure a gateway's CPU per chunk under
(``scripts/bench_redis_seal.py``, ``scripts/bench_redis_cluster.py``): ``--streams`` x
``--chunks`` at the simulator's ``--itl-ms``, as ``bench peers`` sends it, taking turns for
``--rounds`` rounds, from one tapped simulator with room for all of it."""

from __future__ import annotations

import argparse

from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe_bench.tap import Tap

__all__ = ["load_options", "tapped_engine"]


def load_options(description: str) -> argparse.Namespace:
    """The command line of a shared-store script: its load and its rounds."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=300)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=5)
    return parser.parse_args()


def tapped_engine(streams: int, chunks: int, itl_ms: float) -> Tap:
    """A simulator that holds ``streams`` answers of ``chunks`` tokens at once, each token
    ``itl_ms`` apart whatever the batch, behind a tap that times its events."""
    config = SimConfig(
        memory_tokens=max(1_000_000, streams * (chunks + 64) * 4),
        max_num_seqs=max(streams, 1),
        itl_ms=itl_ms,
        itl_ms_per_seq=0.0,
        prefill_ms_per_token=0.0,
        default_max_tokens=chunks,
    )
    return Tap(Simulator(config))
