"""The settings of a transport for unmodified SDKs: one immutable value."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from streamsafe.retry import StreamingConfig

__all__ = ["TransportSettings"]


@dataclass(frozen=True)
class TransportSettings:
    """``grace``: how long an attempt the SDK stopped waiting for keeps running for a retry to
    claim it (10 s: above the longest backoff a Stainless SDK waits after a timeout, 8 s plus
    jitter), after which it is closed (the engine aborts it). ``patience``: how long an attempt
    may wait for its response headers in all, whatever the SDK's read timeout (600 s, the
    openai SDK's own default). ``streaming``: how a broken resumable stream is resumed (its
    ``resume``, ``max_resumes`` and backoff). ``clock`` and ``rand`` feed the retry core."""

    grace: float = 10.0
    patience: float | None = 600.0
    streaming: StreamingConfig = field(default_factory=StreamingConfig)
    clock: Callable[[], float] = time.time
    rand: Callable[[], float] = random.random
