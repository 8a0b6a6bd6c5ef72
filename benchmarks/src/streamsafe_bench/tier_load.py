"""The load of a middle-tier run: ``calls`` concurrent chat calls made through unmodified
llama-stack-client as an application makes them, the engine sized for them, and the text each
call should get.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from streamsafe.engine_sim import SimConfig, expected_text
from streamsafe_bench.harness import Workload

__all__ = [
    "Api",
    "CallResult",
    "TierLoad",
    "call_llama_stack",
    "engine_for",
    "expected_answer",
    "llama_stack_client",
]

Api = Literal["native", "openai"]


@dataclass(frozen=True)
class TierLoad:
    """``calls`` concurrent chat calls through llama-stack-client: ``api`` ``native``
    (``inference.chat_completion``) or ``openai`` (``chat.completions.create``), streamed or not,
    with the client's ``timeout_s`` (its 60 s default, time-compressed) and ``max_retries`` (its
    default, 2)."""

    calls: int = 32
    prompt_tokens: int = 200
    max_tokens: int = 100
    stream: bool = True
    api: Api = "native"
    timeout_s: float = 3.0
    max_retries: int = 2
    model: str = "sim-llama-8b"

    @property
    def workload(self) -> Workload:
        """The prompts (distinct per call, so no two calls are the same work)."""
        return Workload(self.calls, self.prompt_tokens, self.max_tokens, self.model)

    def messages(self, i: int) -> list[dict[str, Any]]:
        """The messages of call ``i``."""
        messages: list[dict[str, Any]] = self.workload.body(i)["messages"]
        return messages


def engine_for(load: TierLoad, **overrides: Any) -> SimConfig:
    """An engine with room for each call of ``load`` once (prompt plus answer, a few tokens
    spare), so copies of the same calls kill it, running at most half the calls at a time (the
    rest wait in its queue, as a busy vLLM's do): the report's engine, time-compressed."""
    per_call = load.prompt_tokens + load.max_tokens + 8
    base: dict[str, Any] = {
        "model": load.model,
        "memory_tokens": load.calls * per_call,
        "max_num_seqs": max(1, load.calls // 2),
        "itl_ms": 30.0,
        "itl_ms_per_seq": 0.2,
        "prefill_ms_per_token": 0.02,
        "default_max_tokens": load.max_tokens,
    }
    base.update(overrides)
    return SimConfig(**base)


def expected_answer(load: TierLoad, i: int, seed: int = 0) -> str:
    """The text Llama Stack gives call ``i`` unloaded: the engine's text, less its last token on
    the native streamed chat route (Llama Stack drops the token sent with ``finish_reason``)."""
    body = {"model": load.model, "messages": load.messages(i)}
    text = expected_text(body, load.max_tokens, seed)
    if load.api == "native" and load.stream:
        text = text.rsplit(" ", 1)[0] if " " in text else ""
    return text


@dataclass
class CallResult:
    """What one call gave its caller: the text, or the error it raised (its type name), or
    ``in-stream error`` where Llama Stack's masked error arrived as an ordinary chunk."""

    text: str
    error: str | None
    seconds: float


async def call_llama_stack(client: Any, load: TierLoad, i: int) -> CallResult:
    """Make call ``i`` of ``load`` with ``client`` (an ``AsyncLlamaStackClient``) as an
    application would, and return what it got."""
    t0 = time.monotonic()
    parts: list[str] = []
    messages = load.messages(i)
    try:
        if load.api == "native":
            params = {"max_tokens": load.max_tokens}
            if load.stream:
                stream = await client.inference.chat_completion(
                    model_id=load.model, messages=messages, sampling_params=params, stream=True
                )
                async for chunk in stream:
                    event = getattr(chunk, "event", None)
                    if event is None:  # Llama Stack's masked error, read as a chunk
                        return CallResult("".join(parts), "in-stream error", _since(t0))
                    text = getattr(event.delta, "text", None)
                    if text:
                        parts.append(text)
            else:
                response = await client.inference.chat_completion(
                    model_id=load.model, messages=messages, sampling_params=params
                )
                parts.append(str(response.completion_message.content))
        else:
            kwargs = {"model": load.model, "messages": messages, "max_tokens": load.max_tokens}
            if load.stream:
                stream = await client.chat.completions.create(**kwargs, stream=True)
                async for chunk in stream:
                    choices = getattr(chunk, "choices", None)
                    if not choices:
                        return CallResult("".join(parts), "in-stream error", _since(t0))
                    content = choices[0].delta.content
                    if content:
                        parts.append(content)
            else:
                response = await client.chat.completions.create(**kwargs)
                parts.append(str(response.choices[0].message.content))
    except Exception as exc:
        return CallResult("".join(parts), type(exc).__name__, _since(t0))
    return CallResult("".join(parts), None, _since(t0))


def _since(t0: float) -> float:
    return time.monotonic() - t0


@contextlib.asynccontextmanager
async def llama_stack_client(base_url: str, load: TierLoad) -> AsyncIterator[Any]:
    """An ``AsyncLlamaStackClient`` for ``base_url`` with the load's timeout and retries, and
    room for every call at once."""
    import httpx
    from llama_stack_client import AsyncLlamaStackClient

    client = AsyncLlamaStackClient(
        base_url=base_url,
        timeout=httpx.Timeout(load.timeout_s, connect=load.timeout_s),
        max_retries=load.max_retries,
        http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=load.calls * 4)),
    )
    try:
        yield client
    finally:
        await client.close()
