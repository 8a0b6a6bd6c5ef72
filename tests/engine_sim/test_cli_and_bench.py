"""The ``simulate`` command line builds the config it says, and the simulator benchmark's
measurement works against an in-process simulator."""

from __future__ import annotations

import argparse
import os

from streamsafe.engine_sim import Fault
from streamsafe.engine_sim.cli import build_config, register
from streamsafe_bench.simulator import measure_level


def _parse(argv):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["simulate", *argv])


def test_every_flag_reaches_the_config():
    cfg = build_config(
        _parse(
            [
                "--model", "m", "--memory-tokens", "100", "--max-num-seqs", "3",
                "--prefill-ms-per-token", "0.5", "--itl-ms", "2", "--itl-ms-per-seq", "0.3",
                "--default-max-tokens", "7", "--no-abort-on-disconnect",
                "--headers-after-first-token", "--fault", "status:503:0.1",
                "--fault", "cut:2-4:0.5", "--seed", "9",
            ]
        )
    )  # fmt: skip
    assert (cfg.model, cfg.memory_tokens, cfg.max_num_seqs) == ("m", 100, 3)
    assert (cfg.prefill_ms_per_token, cfg.itl_ms, cfg.itl_ms_per_seq) == (0.5, 2.0, 0.3)
    assert cfg.default_max_tokens == 7 and cfg.seed == 9
    assert not cfg.abort_on_disconnect and cfg.headers_after_first_token
    assert cfg.faults == (Fault.parse("status:503:0.1"), Fault.parse("cut:2-4:0.5"))


def test_defaults_match_the_issue():
    cfg = build_config(_parse([]))
    assert (cfg.memory_tokens, cfg.max_num_seqs, cfg.default_max_tokens) == (32768, 64, 256)
    assert cfg.abort_on_disconnect and not cfg.headers_after_first_token and cfg.faults == ()


def test_bench_level_counts_every_streamed_token(serve):
    _sim, server = serve(itl_ms=2.0)
    level = measure_level(server.port, os.getpid(), streams=4, itl_ms=2.0, seconds=0.04)
    assert level["complete_streams"] == 4
    assert level["itl_ratio_mean"] is not None and level["itl_ratio_mean"] > 0
