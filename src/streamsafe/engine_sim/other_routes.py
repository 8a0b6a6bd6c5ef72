"""The simulator's routes besides the completions, as vLLM answers them: what the engine tells of
itself (``GET /v1/models``, ``/health``, ``/metrics``, ``/stats``, ``/version``, ``/is_sleeping``;
``POST /admin/restart``) and the calls that generate nothing (``POST /v1/embeddings``,
``/v1/audio/transcriptions``, ``/tokenize``, ``/v1/messages/count_tokens``).

:class:`~streamsafe.engine_sim.app.Simulator` routes them here; the completions are its own.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import orjson

from streamsafe.engine_sim.config import SimConfig
from streamsafe.engine_sim.engine import Engine
from streamsafe.engine_sim.messages import MessagesWriter, count_tokens_body, to_chat
from streamsafe.engine_sim.refusals import refuse
from streamsafe.engine_sim.validation import BadRequest
from streamsafe.engine_sim.wire import error_body
from streamsafe.server.asgi import (
    BodyTooLarge,
    Disconnected,
    Receive,
    Scope,
    Send,
    read_body,
    respond,
)
from streamsafe.tokens import estimate_input_tokens, estimate_prompt_tokens

__all__ = ["OtherRoutes"]

_METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


class OtherRoutes:
    """Every route of the simulator but the completions' (see the module), over its ``engine``
    and ``config``: each an ASGI handler its route table names."""

    def __init__(self, config: SimConfig, engine: Engine) -> None:
        self.config = config
        self.engine = engine

    # -- what the engine tells of itself -----------------------------------------------------

    async def models(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``GET /v1/models``: the one model, with its ``max_model_len``."""
        cfg = self.config
        body = {
            "object": "list",
            "data": [
                {
                    "id": cfg.model,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm",
                    "root": cfg.model,
                    "parent": None,
                    "max_model_len": cfg.max_model_len or cfg.memory_tokens,
                }
            ],
        }
        await respond(send, 200, orjson.dumps(body))

    async def health(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``GET /health``: 200, or 503 once the engine is dead."""
        if self.engine.dead:
            await respond(send, 503, error_body(self.engine.dead_message, 503))
        else:
            await respond(send, 200, b"", content_type=None)

    async def stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``GET /stats``: the engine's counters as JSON."""
        await respond(send, 200, orjson.dumps(self.engine.stats()))

    async def restart(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /admin/restart``: revive the engine; its crash and restart counts."""
        self.engine.restart()
        stats = self.engine.stats()
        body = {"restarted": True, "crashes": stats["crashes"], "restarts": stats["restarts"]}
        await respond(send, 200, orjson.dumps(body))

    async def metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``GET /metrics``: Prometheus text with vLLM's names."""
        from streamsafe.engine_sim.metrics import render_metrics

        cfg = self.config
        kv_tokens = cfg.memory_tokens if cfg.publish_kv_cache else None
        text = render_metrics(cfg.model, self.engine.stats(), kv_tokens)
        await respond(send, 200, text.encode(), content_type=_METRICS_TYPE)

    async def version(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``GET /version``: the simulator's name where vLLM's version would be."""
        await respond(send, 200, b'{"version":"streamsafe-sim"}')

    async def is_sleeping(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's dev-mode ``GET /is_sleeping`` (an operator route: the simulator never
        sleeps)."""
        await respond(send, 200, b'{"is_sleeping":false}')

    # -- calls that generate nothing ---------------------------------------------------------

    async def embeddings(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's ``POST /v1/embeddings`` in its shape: one vector per input, a function of
        the input's text (equal inputs, equal vectors), ``usage`` counted as the gateway's
        admission counts it."""
        try:
            body = orjson.loads(await read_body(receive, self.config.max_body_bytes))
            if not isinstance(body, dict) or body.get("model", self.config.model) != (
                self.config.model
            ):
                raise BadRequest(f"The model `{_model_named(body)}` does not exist.", 404)
            given = body.get("input")
            inputs = given if isinstance(given, list) and given else [given]
            if not all(isinstance(i, str) for i in inputs):
                raise BadRequest("'input' must be a string or a list of strings")
        except Disconnected:
            return
        except (BodyTooLarge, orjson.JSONDecodeError, BadRequest) as exc:
            await refuse(send, exc)
            return
        self.engine.count("embeddings")
        tokens = estimate_input_tokens({"input": inputs})
        data = [
            {"index": i, "object": "embedding", "embedding": _vector(text)}
            for i, text in enumerate(inputs)
        ]
        answer = {
            "id": f"embd-{self.engine.stats()['embeddings']}",
            "object": "list",
            "created": int(time.time()),
            "model": self.config.model,
            "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
        }
        await respond(send, 200, orjson.dumps(answer))

    async def transcription(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's ``POST /v1/audio/transcriptions``: a multipart form read as it comes (each
        chunk counted in ``form_bytes_received`` on arrival, so a test sees whether a gateway
        streams it), answered ``{"text"}`` naming its size."""
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            self.engine.count("form_bytes_received", len(chunk))
            if not message.get("more_body", False):
                break
        await respond(send, 200, orjson.dumps({"text": f"{size} bytes of form"}))

    async def tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's ``POST /tokenize``: a chat (``messages``) or completion (``prompt``) request's
        prompt tokens, counted as a completion of it would count them (its ``usage``)."""
        try:
            body = orjson.loads(await read_body(receive, self.config.max_body_bytes))
            if not isinstance(body, dict) or not (
                isinstance(body.get("messages"), list) or isinstance(body.get("prompt"), str)
            ):
                raise BadRequest("give 'messages' (a list) or 'prompt' (a string)")
            count = estimate_prompt_tokens(body)
        except Disconnected:
            return
        except (BodyTooLarge, orjson.JSONDecodeError, BadRequest) as exc:
            await refuse(send, exc)
            return
        answer = {
            "count": count,
            "max_model_len": self.config.max_model_len or self.config.memory_tokens,
            "tokens": list(range(count)),
            "token_strs": None,
        }
        await respond(send, 200, orjson.dumps(answer))

    async def count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/messages/count_tokens``: the prompt's tokens, as the chat counts them."""
        try:
            chat = to_chat(
                orjson.loads(await read_body(receive, self.config.max_body_bytes)), count_only=True
            )
        except (BadRequest, orjson.JSONDecodeError, BodyTooLarge, Disconnected) as exc:
            await refuse(MessagesWriter(send, 0).send, exc)
            return
        await respond(send, 200, count_tokens_body(estimate_prompt_tokens(chat)))


def _vector(text: str, size: int = 8) -> list[float]:
    """An embedding of ``text``: ``size`` numbers in [-1, 1) drawn from its digest."""
    digest = hashlib.blake2b(text.encode(), digest_size=size).digest()
    return [(b - 128) / 128 for b in digest]


def _model_named(body: Any) -> str:
    return str(body.get("model")) if isinstance(body, dict) else ""
