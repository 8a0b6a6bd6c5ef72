"""streamsafe's demo and benchmarks (the streamsafe-bench distribution, ``benchmarks/``).

Kept out of streamsafe's wheel: ``streamsafe demo`` and ``streamsafe bench`` load this package by
name when they run (see ``streamsafe.cli``), and nothing in streamsafe imports it. It also holds
the launchers the tests start real servers with (the simulator harness, vLLM, Llama Stack, OGX,
the peers).
"""
