"""Answering one completion request from the engine, once it is valid and past the faults that
refuse it outright: the unary body or the token stream, a watcher that notices a client that
vanishes wherever its request is (stalled, queued, prefilling or streaming), and the faults
injected into the answer (stall, cut, hang, malformed event, no ``[DONE]``, the engine's crash).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

from streamsafe.engine_sim.config import SimConfig
from streamsafe.engine_sim.engine import Engine, EngineDeadError
from streamsafe.engine_sim.faults import Drawn, StreamCut
from streamsafe.engine_sim.generation import Generation, GenState
from streamsafe.engine_sim.text import TextStream
from streamsafe.engine_sim.validation import Job
from streamsafe.engine_sim.wire import DONE_EVENT, ChunkEncoder, error_body, error_event
from streamsafe.server.asgi import Receive, Send, respond

__all__ = ["Completion"]

_SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
#: The malformed fault's event: a chunk cut off in the middle of its JSON.
_MALFORMED_EVENT = b'data: {"id":"chatcmpl-broken","object":"chat.completion.chunk","choi\n\n'


def _tokens_in(parts: list[bytes]) -> int:
    """Token events among ``parts`` (neither the role event nor a malformed one)."""
    return sum(1 for p in parts if b'"delta":{"role"' not in p and p != _MALFORMED_EVENT)


class Completion:
    """One completion request answered from ``engine``: :meth:`serve` watches for the client's
    disconnect while it answers ``job`` with the drawn ``faults``."""

    __slots__ = ("config", "engine", "faults", "gen", "gone", "gone_event", "job")

    def __init__(self, engine: Engine, config: SimConfig, job: Job, faults: Drawn) -> None:
        self.engine = engine
        self.config = config
        self.job = job
        self.faults = faults
        #: The generation, once admitted.
        self.gen: Generation | None = None
        #: The client disconnected.
        self.gone = False
        self.gone_event = asyncio.Event()

    async def serve(self, receive: Receive, send: Send) -> None:
        """Answer the request (streamed or not) while a watcher reads ``receive`` until
        ``http.disconnect``."""
        watcher = asyncio.create_task(self._watch(receive))
        try:
            if self.job.stream:
                await self._stream(send)
            else:
                await self._unary(send)
        finally:
            watcher.cancel()

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
        self.gone = True
        self.gone_event.set()
        if self.gen is not None:
            self.engine.client_gone(self.gen)

    def _encoder(self) -> ChunkEncoder:
        job = self.job
        prefix = "chatcmpl-" if job.chat else "cmpl-"
        return ChunkEncoder(
            chat=job.chat,
            request_id=prefix + uuid.uuid4().hex,
            created=int(time.time()),
            model=self.config.model,
        )

    async def _admit(self) -> Generation | None:
        """The job's generation, submitted after the stall fault (if any); ``None`` where the
        client left during the stall. Raises :class:`EngineDeadError`."""
        job, faults = self.job, self.faults
        if faults.stall_s > 0:
            self.engine.count("faults_stall")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.gone_event.wait(), faults.stall_s)
        if self.gone:
            return None
        gen = self.engine.submit(
            job.prompt_tokens,
            job.max_tokens,
            continuation=job.body.get("continue_final_message") is True,
        )
        self.gen = gen
        if self.gone:  # vanished between the watcher's check and admission
            self.engine.client_gone(gen)
        return gen

    async def _unary(self, send: Send) -> None:
        job = self.job
        try:
            gen = await self._admit()
        except EngineDeadError as exc:
            await respond(send, 500, error_body(str(exc), 500))
            return
        if gen is None:
            return
        await gen.wait_end()
        if gen.state == GenState.FAILED:
            if not self.gone:
                await respond(send, 500, error_body(gen.error, 500))
            return
        if gen.state != GenState.DONE or self.gone:
            return
        text = TextStream(job.body, self.config.seed).text(gen.generated)
        body = self._encoder().complete(text, job.prompt_tokens, gen.generated)
        await respond(send, 200, body)
        gen.sent = gen.generated

    async def _stream(self, send: Send) -> None:
        cfg, job, faults = self.config, self.job, self.faults
        started = False
        if not cfg.headers_after_first_token:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE})
            started = True
        gen = await self._admit_stream(send, started)
        if gen is None:
            return
        enc = self._encoder()
        text = TextStream(job.body, cfg.seed)
        last_index = gen.max_tokens - 1
        budget, crash = _cut_budget(faults)  # data events left before a cut
        events_out = 0  # data events sent (for the hang and malformed faults)
        role_pending = job.chat
        while True:
            await gen.wait()
            state = gen.state
            if self.gone or state == GenState.ABORTED:
                return
            if faults.pause_after is not None and events_out >= faults.pause_after:
                if not await self._pause():
                    return
                state = gen.state
            n = gen.generated
            parts: list[bytes] = []
            if n > gen.sent and role_pending:
                parts.append(enc.role())
                role_pending = False
            for i in range(gen.sent, n):
                parts.append(enc.token(text.token(i), i == last_index))
            end: bytes | None = None
            if state == GenState.DONE:
                end = (enc.usage(job.prompt_tokens, n) if job.include_usage else b"") + DONE_EVENT
                parts.append(end)
            elif state == GenState.FAILED:
                end = error_event(gen.error) + DONE_EVENT
                if not started and not parts:
                    await respond(send, 500, error_body(gen.error, 500))
                    return
                parts.append(end)
            end = self._spoil(parts, end, events_out)
            if faults.hang_after is not None:
                at = faults.hang_after - events_out
                if at < len(parts) - (end is not None) or end is not None:
                    await self._hang(send, gen, parts[: max(0, at)], n, started)
                    return
            events_out += len(parts)
            if budget is not None and len(parts) - (end is not None) >= budget:
                await self._cut(send, gen, parts[:budget], n, started, crash)
                return
            if budget is not None:
                budget -= len(parts) - (end is not None)
            await _send_step(send, parts, started, last=end is not None)
            started = True
            gen.sent = n
            if end is not None:
                return

    async def _admit_stream(self, send: Send, started: bool) -> Generation | None:
        """The stream's generation (:meth:`_admit`); ``None`` where the client left or the
        engine died (that is answered, as an error event where the headers went out)."""
        try:
            return await self._admit()
        except EngineDeadError as exc:
            if started:
                await _finish(send, error_event(str(exc)) + DONE_EVENT)
            else:
                await respond(send, 500, error_body(str(exc), 500))
            return None

    def _spoil(self, parts: list[bytes], end: bytes | None, events_out: int) -> bytes | None:
        """The no-[DONE] and malformed faults, on one step's events (``end``: its last, where
        the stream ends there); the end as sent."""
        faults = self.faults
        if end is not None and faults.nodone and end.endswith(DONE_EVENT):
            self.engine.count("faults_nodone")
            parts[-1] = end = end[: -len(DONE_EVENT)]
        if faults.malformed_after is not None:
            at = faults.malformed_after - events_out
            if 0 <= at <= len(parts) - (end is not None):
                self.engine.count("faults_malformed")
                parts.insert(at, _MALFORMED_EVENT)
                faults.malformed_after = None
        return end

    async def _pause(self) -> bool:
        """The pause fault, once: nothing sent for its seconds (or until the client leaves);
        whether the client is still there."""
        self.faults.pause_after = None
        self.engine.count("faults_pause")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.gone_event.wait(), self.faults.pause_s)
        return not self.gone

    async def _hang(
        self,
        send: Send,
        gen: Generation,
        parts: list[bytes],
        n: int,
        started: bool,
    ) -> None:
        """Send ``parts``, then nothing more with the connection open, as a frozen engine does;
        the request is dropped once the client leaves."""
        self.engine.count("faults_hang")
        await _send_last(send, gen, parts, n, started)
        await self.gone_event.wait()
        self.engine.client_gone(gen)

    async def _cut(
        self,
        send: Send,
        gen: Generation,
        parts: list[bytes],
        n: int,
        started: bool,
        crash: bool,
    ) -> None:
        """Send ``parts``, then drop the connection; with ``crash`` the engine dies first (its
        other streams get the death's error event; this one is only cut, as by a process that
        is gone)."""
        await _send_last(send, gen, parts, n, started)
        if crash:
            self.engine.count("faults_crash")
            self.engine.crash("injected fault: crash")
        else:
            self.engine.count("faults_cut")
            self.engine.client_gone(gen)
        raise StreamCut("injected fault: connection cut")


async def _send_last(
    send: Send, gen: Generation, parts: list[bytes], n: int, started: bool
) -> None:
    """Send ``parts``, the last a faulty stream sends, and note the tokens among them as sent."""
    if not started:
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
    if parts:
        await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
    gen.sent = min(n, gen.sent + _tokens_in(parts))


async def _finish(send: Send, body: bytes) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _cut_budget(faults: Drawn) -> tuple[int | None, bool]:
    """Data events a stream sends before its injected cut (``None``: no cut), and whether the
    cut is a crash: a crash is a cut that takes the engine with it; the earlier one happens."""
    budget = faults.cut_after
    crash = faults.crash_after is not None and (budget is None or faults.crash_after < budget)
    return (faults.crash_after if crash else budget), crash


async def _send_step(send: Send, parts: list[bytes], started: bool, *, last: bool) -> None:
    """One step's events, after the response's start where it has not gone out yet; ``last``:
    they end the stream."""
    if not started:
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
    if last:
        await _finish(send, b"".join(parts))
    else:
        await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
