"""One request inside the simulated engine: its state, its tokens, and the one future its handler
waits on (resolved by the step that gives it a token or by its end, so a stream costs one wake-up
per step however many tokens it is behind).
"""

from __future__ import annotations

import asyncio
import enum

__all__ = ["TERMINAL", "GenState", "Generation"]


class GenState(enum.IntEnum):
    """Where a generation is in its life."""

    WAITING = 0
    RUNNING = 1
    DONE = 2
    ABORTED = 3
    FAILED = 4


#: The states after which no more tokens come.
TERMINAL = (GenState.DONE, GenState.ABORTED, GenState.FAILED)


class Generation:
    """One request inside the engine. ``sent`` is advanced by the handler that writes tokens
    out; ``detached`` means its client is gone but it keeps generating (no abort on disconnect)."""

    __slots__ = (
        "detached",
        "error",
        "generated",
        "id",
        "max_tokens",
        "prompt_tokens",
        "sent",
        "state",
        "waiter",
    )

    def __init__(self, gen_id: int, prompt_tokens: int, max_tokens: int) -> None:
        self.id = gen_id
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.generated = 0
        self.sent = 0
        self.state = GenState.WAITING
        self.detached = False
        self.error = ""
        self.waiter: asyncio.Future[None] | None = None

    @property
    def finished(self) -> bool:
        """Done, aborted or failed: no more tokens will come."""
        return self.state in TERMINAL

    async def wait(self) -> None:
        """Until the next token or the end (returns at once if there is news already)."""
        if self.generated > self.sent or self.state in TERMINAL:
            return
        fut = asyncio.get_running_loop().create_future()
        self.waiter = fut
        try:
            await fut
        finally:
            self.waiter = None

    async def wait_end(self) -> None:
        """Until the generation is done, aborted or failed."""
        loop = asyncio.get_running_loop()
        while self.state not in TERMINAL:
            fut = loop.create_future()
            self.waiter = fut
            try:
                await fut
            finally:
                self.waiter = None

    def wake(self) -> None:
        """Resolve the waiter, if any (the engine calls this on news)."""
        fut = self.waiter
        if fut is not None:
            self.waiter = None
            if not fut.done():
                fut.set_result(None)
