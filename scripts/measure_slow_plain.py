"""A plain (non-streamed) answer that outlasts the client's read timeout, the gateway in front of
today's server with its default flags (issue 28, row 5): one answer of about ``--seconds``
seconds (the simulator's inter-token time times ``--tokens``), asked once by each unmodified
client with a ``--timeout`` read timeout and its default retries (2): llama-stack-client 0.7.5
(in llama-stack 0.7.3's venv) and openai-python. Reported per flavor and client: whether the
caller got the whole answer, how long it took, what the gateway saw as retries and how many
requests reached the engine (counted by the engine behind the server).

    PYTHONPATH=src:benchmarks/src python scripts/measure_slow_plain.py [--seconds 14] [--timeout 3]
        [--flavor ogx --flavor llama-stack-0.7]
"""

from __future__ import annotations

import argparse
import json
import time

import openai

from streamsafe.engine_sim import SimConfig, Simulator, expected_text
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerThread
from streamsafe_bench.client_calls import run_calls
from streamsafe_bench.llamastack_deployment import llama_stack_deployment
from streamsafe_bench.ogx_server import FLAVORS, LLAMA_STACK_07, OGXServer, find_venv

MODEL = "sim-llama-8b"


def one_call(client: str, url: str, timeout: float, tokens: int, label: str) -> dict[str, object]:
    """One plain call through ``client``; what it got."""
    messages = [{"role": "user", "content": f"a slow plain answer for {label}"}]
    model = f"vllm/{MODEL}"
    t0 = time.monotonic()
    if client == "openai":
        sdk = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=timeout)
        try:
            reply = sdk.chat.completions.create(
                model=model,
                messages=messages,  # type: ignore[arg-type]
                max_tokens=tokens,
            )
            text, error = reply.choices[0].message.content or "", None
        except openai.OpenAIError as exc:
            text, error = "", type(exc).__name__
        finally:
            sdk.close()
    else:
        plan = {
            "client": "llama-stack-client",
            "base_url": url,
            "calls": [{"model": model, "messages": messages, "max_tokens": tokens}],
            "timeout": timeout,
        }
        (result,) = run_calls(find_venv(LLAMA_STACK_07) / "bin" / "python", plan)
        text, error = result["text"], result["error"]
    body = {"model": MODEL, "messages": messages, "max_tokens": tokens}
    return {
        "exact": error is None and text == expected_text(body, tokens),
        "error": error,
        "seconds": round(time.monotonic() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/measure_slow_plain.py")
    parser.add_argument("--seconds", type=float, default=14.0, help="the answer's length")
    parser.add_argument("--timeout", type=float, default=3.0, help="the clients' read timeout")
    parser.add_argument("--tokens", type=int, default=28)
    parser.add_argument("--flavor", action="append", choices=sorted(FLAVORS))
    args = parser.parse_args(argv)
    itl_ms = args.seconds * 1000.0 / args.tokens
    for name in args.flavor or sorted(FLAVORS):
        flavor = FLAVORS[name]
        with llama_stack_deployment(
            Simulator(SimConfig(model=MODEL)),
            MODEL,
            server=lambda url, f=flavor: OGXServer(url, flavor=f),  # type: ignore[misc]
        ) as deployment:
            for client in ("llama-stack-client", "openai"):
                sim = Simulator(
                    SimConfig(model=MODEL, itl_ms=itl_ms, itl_ms_per_seq=0.0, default_max_tokens=8)
                )
                deployment.install(sim)
                gateway = Gateway(GatewayConfig(upstream=deployment.url))
                with ServerThread(gateway) as server:
                    got = one_call(client, server.url, args.timeout, args.tokens, name + client)
                    retries = gateway.stats()["retries_seen"]
                deployment.quiesce(quiet_s=2.0, limit_s=60.0)
                row = {
                    "flavor": name,
                    "client": client,
                    **got,
                    "gateway_retries_seen": retries,
                    "engine_requests": sim.stats()["requests_received"],
                }
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
