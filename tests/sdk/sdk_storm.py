"""The retry storm through an unmodified SDK: ``CALLS`` concurrent plain calls, a client timeout
below the engine's answer time, the SDK's 2 retries; with the SDK's own HTTP client or
streamsafe's. Shared by the simulator tests (tests/sdk) and the real vLLM's (tests/vllm)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import streamsafe

CALLS = 8

#: Which httpx each SDK's ``http_client`` must be (see streamsafe.sdk).
PACKAGE = {"openai": "httpx2", "anthropic": "httpx2", "llama-stack-client": "httpx"}


@dataclass
class Storm:
    sdk: str  # openai, anthropic, llama-stack-client
    base_url: str  # the server's root, without /v1
    model: str
    timeout: float
    max_tokens: int
    safe: bool  # with streamsafe.http_client()
    seed: int | None = None  # tagged on each request (vLLM logs it), where the SDK sends it


def _client(storm: Storm) -> Any:
    kw: dict[str, Any] = {"timeout": storm.timeout, "max_retries": 2}
    if storm.safe:
        kw["http_client"] = streamsafe.http_client(package=PACKAGE[storm.sdk])  # type: ignore[arg-type]
    if storm.sdk == "openai":
        import openai

        return openai.OpenAI(base_url=storm.base_url + "/v1", api_key="k", **kw)
    if storm.sdk == "anthropic":
        import anthropic

        return anthropic.Anthropic(base_url=storm.base_url, api_key="k", **kw)
    from llama_stack_client import LlamaStackClient

    return LlamaStackClient(base_url=storm.base_url, **kw)


def _call(storm: Storm, client: Any, i: int) -> Any:
    messages = [{"role": "user", "content": f"Count to ten, call {i}."}]
    extra = {} if storm.seed is None else {"seed": storm.seed}
    if storm.sdk == "anthropic":
        return client.messages.create(
            model=storm.model,
            messages=messages,
            max_tokens=storm.max_tokens,
            extra_body=extra or None,
        )
    return client.chat.completions.create(
        model=storm.model, messages=messages, max_tokens=storm.max_tokens, **extra
    )


def run_storm(storm: Storm, before: Callable[[], None] | None = None) -> list[str]:
    """The storm's calls, each on its own thread and client: ``"ok"`` or the error's name per
    call. ``before`` runs once every thread is started (a test stalls the engine there)."""
    out = [""] * CALLS

    def one(i: int) -> None:
        try:
            _call(storm, _client(storm), i)
            out[i] = "ok"
        except Exception as exc:
            out[i] = type(exc).__name__

    threads = [threading.Thread(target=one, args=(i,)) for i in range(CALLS)]
    for t in threads:
        t.start()
    if before is not None:
        before()
    for t in threads:
        t.join(60)
    return out
