"""Concurrent chat calls made with today's Llama Stack clients, unmodified, as an application makes
them: llama-stack-client 0.7.5 (Stainless: retries, a timeout) and ogx-client 1.5.0 (OpenAPI
Generator: no retries by default, a 5-minute timeout, a pool of 5 connections per core).

Neither client installs beside this project (it pins llama-stack-client 0.2.12), so the calls run
in a child process under the Python of the venv that holds the client (``.venv-llamastack07``,
``.venv-ogx``; :mod:`streamsafe_bench.ogx_server`): this file is run there as a script, reads the
calls as JSON on stdin and writes what each got as JSON on stdout. It imports nothing from this
project, and the clients only inside functions. :func:`run_calls` is the parent's side.

The plan (JSON): ``client`` (``llama-stack-client`` or ``ogx-client``), ``base_url``, ``calls``
(each ``{"model", "messages", "max_tokens", "stream"}``, and ``params``: any other request
fields, e.g. ``{"temperature": 0, "seed": 7}``), ``timeout`` (seconds; ``null``: the
client's default), ``max_retries`` (llama-stack-client's; ``null``: its default, 2),
``provider_data`` (an object both clients send as their provider-data header, or ``null``).
Each result is ``{"text", "error", "seconds"}``: the answer's text, and the error the call raised
(its type name, and for ogx-client's ``ApiException`` its status) or ``null``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["run_calls"]


def run_calls(
    python: str | Path,
    plan: Mapping[str, Any],
    *,
    timeout: float = 300.0,
) -> list[dict[str, Any]]:
    """Run ``plan`` with this file as a script under ``python`` (a venv holding the client) and
    return each call's result, in the order of ``plan["calls"]``."""
    done = subprocess.run(
        [str(python), __file__],
        input=json.dumps(plan).encode(),
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"client calls failed ({done.returncode}): {done.stderr.decode(errors='replace')}"
        )
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


async def _llama_stack_client(plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    from llama_stack_client import AsyncLlamaStackClient

    options: dict[str, Any] = {"base_url": plan["base_url"]}
    if plan.get("timeout") is not None:
        options["timeout"] = plan["timeout"]
    if plan.get("max_retries") is not None:
        options["max_retries"] = plan["max_retries"]
    if plan.get("provider_data") is not None:
        options["provider_data"] = plan["provider_data"]
    client = AsyncLlamaStackClient(**options)

    async def one(call: Mapping[str, Any]) -> str:
        kwargs = {k: call[k] for k in ("model", "messages", "max_tokens")}
        kwargs.update(call.get("params") or {})
        if call.get("stream"):
            parts = []
            stream = await client.chat.completions.create(**kwargs, stream=True)
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
            return "".join(parts)
        response = await client.chat.completions.create(**kwargs)
        return str(response.choices[0].message.content)

    try:
        return await _gather(one, plan["calls"])
    finally:
        await client.close()


async def _ogx_client(plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    # Only the OGX venv has it (this project's environment, where mypy runs, need not).
    from ogx_client import AsyncOgxClient, Configuration  # type: ignore[import-not-found]

    config = Configuration(host=plan["base_url"])
    if plan.get("timeout") is not None:
        config.timeout = plan["timeout"]
    client = AsyncOgxClient(config, provider_data=plan.get("provider_data"))

    async def one(call: Mapping[str, Any]) -> str:
        kwargs = {k: call[k] for k in ("model", "messages", "max_tokens")}
        kwargs.update(call.get("params") or {})
        if call.get("stream"):
            parts = []
            stream = await client.chat.completions.create(**kwargs, stream=True)
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
            return "".join(parts)
        response = await client.chat.completions.create(**kwargs)
        return str(response.choices[0].message.content)

    try:
        return await _gather(one, plan["calls"])
    finally:
        await client.close()


async def _gather(one: Any, calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    async def timed(call: Mapping[str, Any]) -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            text = await one(call)
        except Exception as exc:
            name = type(exc).__name__
            status = getattr(exc, "status", None)
            error = f"{name}(status={status})" if name == "ApiException" else name
            return {"text": "", "error": error, "seconds": time.monotonic() - t0}
        return {"text": text, "error": None, "seconds": time.monotonic() - t0}

    return list(await asyncio.gather(*(timed(c) for c in calls)))


def _main() -> None:
    plan = json.load(sys.stdin)
    drivers = {"llama-stack-client": _llama_stack_client, "ogx-client": _ogx_client}
    results = asyncio.run(drivers[plan["client"]](plan))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    _main()
