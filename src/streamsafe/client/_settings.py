"""A client's settings: one immutable :class:`Settings` value, built from the constructor's
arguments (:func:`make_settings`) and changed per call or by ``with_options``
(:func:`override`), plus the hook type and the :class:`RetryEvent` a hook is told."""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from streamsafe.client.timeouts import Timeouts
from streamsafe.retry import Outcome, RetryBudget, RetryPolicy, StreamingConfig

#: Base URL when neither ``base_url`` nor ``OPENAI_BASE_URL`` is given: vLLM's default port.
DEFAULT_BASE_URL = "http://localhost:8000/v1"


class _Unset:
    def __repr__(self) -> str:
        return "NOT_GIVEN"


#: Marks an argument not given (``None`` means "none" for budget and timeouts).
NOT_GIVEN: Any = _Unset()


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """What a hook (``on_retry`` / ``on_resume``) is told: the decision's ``action``, ``delay``
    and ``reason``, the ``outcome`` that led to it, the call's ``attempts`` and ``resumes``
    so far and its ``idempotency_key``."""

    action: str
    delay: float
    reason: str
    outcome: Outcome
    attempts: int
    resumes: int
    idempotency_key: str | None


Hook = Callable[[RetryEvent], None]


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a client or one call runs with (``with_options`` makes a changed copy)."""

    base_url: str
    api_key: str | None
    timeouts: Timeouts
    retry: RetryPolicy
    streaming: StreamingConfig
    budget: RetryBudget | None
    headers: Mapping[str, str]
    on_retry: Hook | None
    on_resume: Hook | None
    clock: Callable[[], float]
    random: Callable[[], float]

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


def _default_budget(clock: Callable[[], float] | None) -> RetryBudget:
    # A client given a clock (a test's fake one) throttles on that clock too.
    return RetryBudget() if clock is None else RetryBudget(clock=clock)


def _with_max_retries(retry: RetryPolicy, max_retries: int | None) -> RetryPolicy:
    """``retry`` with openai-python's ``max_retries`` where one is given."""
    if max_retries is None:
        return retry
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise TypeError(f"max_retries must be a whole number >= 0, not {max_retries!r}")
    return dataclasses.replace(retry, max_retries=max_retries)


def make_settings(
    *,
    base_url: str | None,
    api_key: str | None,
    timeout: Timeouts | float | None,
    retry: RetryPolicy | None,
    streaming: StreamingConfig | None,
    budget: RetryBudget | None,
    default_headers: Mapping[str, str] | None,
    max_retries: int | None = None,
    on_retry: Hook | None,
    on_resume: Hook | None,
    clock: Callable[[], float] | None,
    rand: Callable[[], float] | None,
) -> Settings:
    base = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
    key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
    return Settings(
        base_url=base.rstrip("/"),
        api_key=key or None,
        timeouts=Timeouts() if timeout is NOT_GIVEN else Timeouts.of(timeout),
        retry=_with_max_retries(retry or RetryPolicy(), max_retries),
        streaming=streaming or StreamingConfig(),
        budget=_default_budget(clock) if budget is NOT_GIVEN else budget,
        headers=dict(default_headers or {}),
        on_retry=on_retry,
        on_resume=on_resume,
        clock=clock or time.time,
        random=rand or random.random,
    )


#: What ``with_options`` changes (besides ``sleep`` and ``http_client``, kept on the client).
OPTION_NAMES = frozenset(
    {
        "base_url",
        "api_key",
        "timeout",
        "retry",
        "max_retries",
        "streaming",
        "budget",
        "default_headers",
        "on_retry",
        "on_resume",
        "clock",
        "rand",
    }
)
# ``None`` for these means "keep what the client has" (openai-python's with_options does the
# same for base_url and api_key); for budget and timeout it is a value (off, no limits).
_NONE_KEEPS = frozenset(
    {"base_url", "api_key", "retry", "max_retries", "streaming", "default_headers"}
)


def override(settings: Settings, changes: dict[str, Any]) -> Settings:
    """``settings`` with the per-call or ``with_options`` changes applied (NOT_GIVEN skipped,
    ``None`` skipped where it means "keep"); an unknown name is a :class:`TypeError`."""
    unknown = set(changes) - OPTION_NAMES
    if unknown:
        raise TypeError(
            f"unknown option(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(OPTION_NAMES | {'sleep', 'http_client'}))}"
        )
    out: dict[str, Any] = {}
    for name, value in changes.items():
        if value is NOT_GIVEN or (value is None and name in _NONE_KEEPS):
            continue
        if name == "timeout":
            out["timeouts"] = Timeouts.of(value)
        elif name == "base_url":
            out["base_url"] = str(value).rstrip("/")
        elif name == "default_headers":
            out["headers"] = {**settings.headers, **(value or {})}
        elif name == "rand":
            out["random"] = value
        elif name != "max_retries":
            out[name] = value
    max_retries = changes.get("max_retries")
    if max_retries is not None and max_retries is not NOT_GIVEN:
        out["retry"] = _with_max_retries(out.get("retry", settings.retry), max_retries)
    return settings.replace(**out) if out else settings
