"""The report's load against today's Llama Stack (OGX 1.5.0, llama-stack 0.7.3), real, in each
position, counted at the engine: the figures of docs/design.md, "Positions around Llama Stack".

    python -m streamsafe_bench.today_positions [--flavor ogx|llama-stack-0.7] [--json FILE]

The server starts once per flavor in front of an engine slot; each run installs a fresh simulator
sized as the report's engine (room for each call once, :func:`engine_for`) and makes 32 concurrent
calls (:class:`TierLoad`): plain calls and streams from llama-stack-client 0.7.5 (3 s timeout, its 2
retries), openai plain calls and streams (3 s, 2 retries), plain calls from ogx-client 1.5.0 with
its defaults and with a 3 s timeout. Positions: ``direct`` (client -> server -> engine),
``in-front`` (client -> gateway, default flags -> server -> engine), ``behind`` (client -> server ->
gateway, default flags -> engine), ``behind-collapse`` (the same with ``--collapse-identical``,
which attaches the client's retry the server sends on as a fresh call), ``behind-answer`` (the same
with ``--engine-refusals answer``, which answers the server's retries of a refused request without
asking the engine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe.engine_sim.config import Fault
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from streamsafe_bench.client_calls import run_calls
from streamsafe_bench.llamastack_deployment import Deployment, llama_stack_deployment
from streamsafe_bench.ogx_server import FLAVORS, LLAMA_STACK_07, OGX, Flavor, OGXServer, find_venv
from streamsafe_bench.tier_load import TierLoad, engine_for, expected_answer

__all__ = ["DEMO_ROWS", "LOADS", "POSITIONS", "Row", "demo_rows", "main", "run"]

Position = Literal["direct", "in-front", "behind", "behind-collapse", "behind-answer"]
POSITIONS: tuple[Position, ...] = (
    "direct",
    "in-front",
    "behind",
    "behind-collapse",
    "behind-answer",
)
#: The loads: (name, client, streamed, the client's timeout or None for its default).
LOADS: tuple[tuple[str, str, bool, float | None], ...] = (
    ("llama-stack-client plain", "llama-stack-client", False, 3.0),
    ("llama-stack-client streams", "llama-stack-client", True, 3.0),
    ("openai plain", "openai", False, 3.0),
    ("openai streams", "openai", True, 3.0),
    ("ogx-client plain, defaults", "ogx-client", False, None),
    ("ogx-client plain, 3 s", "ogx-client", False, 3.0),
)


@dataclass
class Row:
    """One run: what the callers got and what the engine did."""

    flavor: str
    position: str
    load: str
    calls: int
    exact: int
    errors: dict[str, int] = field(default_factory=dict)
    engine_requests: int = 0
    engine_generations: int = 0
    engine_dead: bool = False
    seconds: float = 0.0


@contextlib.contextmanager
def _position(
    deployment: Deployment, position: Position, sim: Simulator
) -> Iterator[tuple[str, Gateway | None]]:
    if position == "direct":
        deployment.install(sim)
        yield deployment.url, None
    elif position == "in-front":
        deployment.install(sim)
        gateway = Gateway(GatewayConfig(upstream=deployment.url))
        with ServerThread(gateway) as server:
            yield server.url, gateway
    else:
        with ServerThread(sim) as engine:
            config = GatewayConfig(
                upstream=engine.url,
                upstream_kind="vllm",
                collapse_identical="all" if position == "behind-collapse" else "auto",
                engine_refusals="answer" if position == "behind-answer" else "wait",
            )
            gateway = Gateway(config)
            deployment.install(gateway)
            try:
                yield deployment.url, gateway
            finally:
                deployment.install(Simulator(SimConfig(model=sim.config.model)))


async def _openai_calls(url: str, load: TierLoad, model: str) -> list[dict[str, Any]]:
    """The load through openai-python (its retries, ``load``'s timeout), streamed or plain."""
    import openai

    client = openai.AsyncOpenAI(
        base_url=url + "/v1", api_key="none", timeout=load.timeout_s, max_retries=load.max_retries
    )

    async def one(i: int) -> dict[str, Any]:
        parts: list[str] = []
        messages: Any = load.messages(i)
        try:
            if not load.stream:
                answer = await client.chat.completions.create(
                    model=model, messages=messages, max_tokens=load.max_tokens
                )
                return {"text": answer.choices[0].message.content or "", "error": None}
            stream = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=load.max_tokens, stream=True
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
        except Exception as exc:
            return {"text": "".join(parts), "error": type(exc).__name__}
        return {"text": "".join(parts), "error": None}

    try:
        return list(await asyncio.gather(*(one(i) for i in range(load.calls))))
    finally:
        await client.close()


def _calls(url: str, client: str, load: TierLoad, timeout: float | None) -> list[dict[str, Any]]:
    model = f"vllm/{load.model}"
    if client == "openai":
        return asyncio.run(_openai_calls(url, load, model))
    calls = [
        {
            "model": model,
            "messages": load.messages(i),
            "max_tokens": load.max_tokens,
            "stream": load.stream,
        }
        for i in range(load.calls)
    ]
    plan = {"client": client, "base_url": url, "calls": calls, "timeout": timeout}
    if client == "llama-stack-client":
        plan["max_retries"] = load.max_retries
    venv = find_venv(OGX if client == "ogx-client" else LLAMA_STACK_07)
    return run_calls(venv / "bin" / "python", plan)


def run(
    deployment: Deployment,
    flavor: Flavor,
    position: Position,
    load_name: str,
    *,
    refusing: bool = False,
    calls: int = 32,
) -> Row:
    """One load of ``calls`` calls in one position around ``deployment``'s server.
    ``refusing``: one call, to an engine that answers every request 503 (``Retry-After: 1``),
    as a loaded vLLM with ``--max-num-queued-reqs`` does: how many engine requests one logical
    call costs."""
    _, client, stream, timeout = next(x for x in LOADS if x[0] == load_name)
    load = TierLoad(calls=calls, stream=stream, api="openai", timeout_s=timeout or 300.0)
    engine = engine_for(load)
    if refusing:
        load = replace(load, calls=1)
        engine = replace(engine_for(load), faults=(Fault.parse("status:503:1"),))
    sim = Simulator(engine)
    t0 = time.monotonic()
    with _position(deployment, position, sim) as (url, _gateway):
        results = _calls(url, client, load, timeout)
        seconds = time.monotonic() - t0
        # The server keeps working for callers that left; count it all.
        deployment.quiesce(quiet_s=2.0, limit_s=60.0)
        stats = sim.stats()
    errors: dict[str, int] = {}
    for r in results:
        if r["error"] is not None:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    exact = sum(
        r["error"] is None and r["text"] == expected_answer(load, i) for i, r in enumerate(results)
    )
    return Row(
        flavor=flavor.name,
        position=position,
        load=load_name,
        calls=load.calls,
        exact=exact,
        errors=errors,
        engine_requests=stats["requests_received"],
        engine_generations=stats["generations_started"],
        engine_dead=bool(stats["engine_dead"]),
        seconds=round(seconds, 1),
    )


#: The rows ``streamsafe demo --middle-tier ogx`` (or ``llama-stack-0.7``) shows: the report's
#: deployment today, without and with streamsafe in front: (name, position, load, claim).
DEMO_ROWS: tuple[tuple[str, Position, str, str], ...] = (
    (
        "7. llama-stack-client -> server, non-streamed",
        "direct",
        "llama-stack-client plain",
        "the storm: the client's retries times the server's, the engine dies",
    ),
    (
        "8. openai -> server, streamed",
        "direct",
        "openai streams",
        "no copies, but callers time out waiting for a first token",
    ),
    (
        "9. ... -> streamsafe -> server, non-streamed",
        "in-front",
        "llama-stack-client plain",
        "default flags: retries attach, one generation each, every caller answered",
    ),
    (
        "10. ... -> streamsafe -> server, streamed",
        "in-front",
        "openai streams",
        "default flags: heartbeats, every caller gets its text",
    ),
)


def demo_rows(
    flavor: Flavor, quick: bool, on_done: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    """Start ``flavor``'s server once and run :data:`DEMO_ROWS` (16 calls each with
    ``quick``, else 32); each row as a dict (:class:`Row`'s fields, ``name`` and ``claim``)."""
    model = TierLoad().model
    rows: list[dict[str, Any]] = []
    with llama_stack_deployment(
        Simulator(SimConfig(model=model)),
        model,
        server=lambda url: OGXServer(url, flavor=flavor),
    ) as deployment:
        for name, position, load_name, claim in DEMO_ROWS:
            row = run(deployment, flavor, position, load_name, calls=16 if quick else 32)
            rows.append({"name": name, "claim": claim, **asdict(row)})
            if on_done is not None:
                on_done(rows[-1])
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run every load in every position for each flavor asked; print a line per run."""
    parser = argparse.ArgumentParser(prog="python -m streamsafe_bench.today_positions")
    parser.add_argument("--flavor", action="append", choices=sorted(FLAVORS))
    parser.add_argument("--position", action="append", choices=POSITIONS)
    parser.add_argument("--load", action="append", choices=[name for name, *_ in LOADS])
    parser.add_argument(
        "--refusing",
        action="store_true",
        help="one call per run, to an engine that refuses every request with 503",
    )
    parser.add_argument("--json", help="write the rows to this file too")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    for name in args.flavor or sorted(FLAVORS):
        flavor = FLAVORS[name]
        model = TierLoad().model
        with llama_stack_deployment(
            Simulator(SimConfig(model=model)),
            model,
            server=lambda url, f=flavor: OGXServer(url, flavor=f),  # type: ignore[misc]
        ) as deployment:
            for position in args.position or POSITIONS:
                for load_name in args.load or [name for name, *_ in LOADS]:
                    row = run(deployment, flavor, position, load_name, refusing=args.refusing)
                    rows.append(row)
                    print(json.dumps(asdict(row)), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump([asdict(r) for r in rows], out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
