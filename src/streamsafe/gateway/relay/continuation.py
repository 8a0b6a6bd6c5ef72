"""Continuing a stream whose upstream connection broke (see docs/design.md, Continuation).

When the stream from the engine ends with no error and no ``[DONE]`` (a proxy or the connection
died), the engine aborted its copy when the connection closed. Which continuation a request gets
is decided from the request alone (:mod:`.continuation_plan`); each is exact or not made:

- **By token ids** (vLLM): the gateway asked for ``return_token_ids``, so the log holds the
  prompt's ids and every chunk's. The continuation is a completion request whose prompt is those
  ids followed by the ids generated so far, ``max_tokens`` what is left, the same sampling
  parameters: the engine resumes from exactly the context it had, and generates nothing twice.
  Its chunks are re-emitted in the caller's format (:class:`Reshape`).
- **Replay and verify** (:mod:`.replay`), where the engine's state is more than its tokens (stop
  strings, penalties, structured outputs, tools, logprobs, a seeded sample).
- **By text** (``continue_final_message``), where no ids came (an engine that sends none, such as
  the simulator, which continues by text exactly).

The log is parsed once, when a stream breaks: the per-chunk path never parses JSON for this.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from streamsafe.gateway.errors import ERROR_PREFIXES
from streamsafe.gateway.generations.request import Continuation, GenerationRequest
from streamsafe.gateway.generations.store import EventLog
from streamsafe.gateway.relay.continuation_plan import plan_continuation
from streamsafe.gateway.relay.replay import Replay, answer_pieces
from streamsafe.request_cost import COMPLETIONS_DEFAULT_MAX_TOKENS, InvalidField, read_int
from streamsafe.sse import DONE

__all__ = [
    "Partial",
    "Reshape",
    "continuation_for",
    "is_role_chunk",
    "owed_end",
    "owed_usage",
    "read_partial",
    "tokenize_body",
    "whole_usage",
    "with_token_ids",
]

#: The fields of a chunk that a usage chunk owed, or a reshaped one, repeats.
_STAMP = ("id", "object", "created", "model")

#: The request fields a continuation by ids carries over: the sampling parameters both of
#: vLLM's completion routes take. Anything else of a chat request (its messages, tools, a
#: response format, logprobs in the chat shape) has no place in a completion by ids; a request
#: that needs it is continued by text, or not at all.
_SAMPLING = (
    "model",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "bad_words",
    "allowed_token_ids",
    "user",
    "priority",
    "stream_options",
)


def with_token_ids(body: Mapping[str, Any]) -> bytes | None:
    """The upstream body of a stream that asks vLLM for token ids (``return_token_ids``), so a
    broken stream can be continued exactly; ``None`` where the caller said otherwise or the
    request could not be continued by ids anyway (several choices)."""
    if "return_token_ids" in body or body.get("n", 1) != 1:
        return None
    return orjson.dumps({**body, "return_token_ids": True})


def is_role_chunk(payload: bytes) -> bool:
    """A chat chunk that carries only the assistant's role (and empty content): a continuation
    opens with one, which the log already has."""
    if b'"role"' not in payload:
        return False
    try:
        delta = orjson.loads(payload)["choices"][0]["delta"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return False
    return isinstance(delta, dict) and not delta.get("content") and not delta.get("tool_calls")


@dataclass(slots=True)
class Partial:
    """What a broken stream delivered: its text, content chunks, whether it had ended, whether
    a usage chunk came, and the last chunk's ``id``, ``created`` and ``model`` (a usage chunk
    owed is stamped with them). ``token_ids`` and ``prompt_ids``: the answer's and the prompt's
    token ids, where the engine sent them with every chunk (``None`` otherwise)."""

    text: str
    chunks: int
    finished: bool
    usage_seen: bool = False
    stamp: dict[str, object] = field(default_factory=dict)
    token_ids: list[int] | None = None
    prompt_ids: list[int] | None = None

    @property
    def tokens(self) -> int:
        """Tokens delivered: counted by their ids where the engine gave them, else one per
        content chunk (vLLM's default of one token per chunk; approximate under
        ``--stream-interval`` or with special tokens)."""
        return len(self.token_ids) if self.token_ids is not None else self.chunks


def _ids(value: object) -> list[int] | None:
    if isinstance(value, list) and all(type(i) is int for i in value):
        return value
    return None


async def read_partial(log: EventLog) -> Partial | None:
    """The partial answer in ``log``, or ``None`` where it cannot be continued (an error event,
    several choices, unparsable chunks). Its text is what the caller read: a chat's content
    and tool-call arguments, a completion's text."""
    parts: list[str] = []
    chunks = 0
    finished = usage_seen = False
    stamp: dict[str, object] = {}
    token_ids: list[int] | None = []
    prompt_ids: list[int] | None = None
    for payload in await log.read(0):
        if payload == DONE or payload.startswith(ERROR_PREFIXES):
            return None
        try:
            chunk = orjson.loads(payload)
            choices = chunk.get("choices") or ()
        except (orjson.JSONDecodeError, AttributeError):
            return None
        usage_seen = usage_seen or isinstance(chunk.get("usage"), dict)
        stamp = {k: chunk[k] for k in _STAMP if k in chunk}
        prompt_ids = prompt_ids or _ids(chunk.get("prompt_token_ids"))
        for choice in choices:
            if choice.get("index", 0) != 0:
                return None
            content, ids = answer_pieces(choice)
            if content:
                parts.append(content)
                chunks += 1
            finished = finished or bool(choice.get("finish_reason"))
            prompt_ids = prompt_ids or _ids(choice.get("prompt_token_ids"))
            if ids is not None and token_ids is not None:
                token_ids.extend(ids)
            elif content or choice.get("finish_reason"):
                token_ids = None  # a token came without its id: the ids are not the answer's
    if prompt_ids is None:
        token_ids = None
    return Partial("".join(parts), chunks, finished, usage_seen, stamp, token_ids, prompt_ids)


def continuation_for(req: GenerationRequest, partial: Partial | None) -> Continuation | str:
    """The request that continues ``partial`` exactly, as its request's plan says
    (:func:`~.continuation_plan.plan_continuation`): by token ids where the log has them, else
    by text for a chat; replayed and verified where the engine's state is more than its tokens.
    Where none can be made, why (the stream ends with it)."""
    try:
        body = orjson.loads(req.body)
    except orjson.JSONDecodeError:
        return "its request could not be read back"
    if not isinstance(body, dict):
        return "its request could not be read back"
    plan = plan_continuation(req.path, body)
    if plan.way == "none":
        return plan.why
    if partial is None:
        return "its answer so far could not be read back"
    if plan.way == "replay":
        return Continuation(req.path, req.body, 0, Replay(partial.text, partial.token_ids))
    by_ids = _by_ids(req, body, partial)
    if by_ids is not None:
        return by_ids
    return _by_text(req, body, partial) or "a completion is continued only by its token ids"


def _owed(body: Mapping[str, Any], name: str, delivered: int) -> int | None:
    """What is left of the limit ``body[name]`` gives, read as the engine reads it (``"30"``
    is 30), after ``delivered`` tokens; ``None`` where the body gives none."""
    try:
        limit = read_int(body, name)
    except InvalidField:  # refused where the request was read; never continued
        return None
    return None if limit is None else max(1, limit - delivered)


def _by_ids(req: GenerationRequest, body: dict[str, Any], partial: Partial) -> Continuation | None:
    ids, prompt = partial.token_ids, partial.prompt_ids
    if ids is None or prompt is None:
        return None
    chat = req.path.endswith("/chat/completions")
    ask: dict[str, Any] = {k: body[k] for k in _SAMPLING if k in body}
    ask.update(prompt=[*prompt, *ids], stream=True, return_token_ids=True)
    # A chat reads max_completion_tokens first; a completions request only max_tokens, 16
    # where it gives none (the continuation must not be granted that default afresh).
    owed = _owed(body, "max_completion_tokens", len(ids)) if chat else None
    owed = owed or _owed(body, "max_tokens", len(ids))
    if owed is None and not chat:
        owed = max(1, COMPLETIONS_DEFAULT_MAX_TOKENS - len(ids))
    if owed is not None:
        ask["max_tokens"] = owed
    with contextlib.suppress(InvalidField):
        min_tokens = read_int(body, "min_tokens")
        if min_tokens:
            ask["min_tokens"] = max(0, min_tokens - len(ids))
    path = req.path[: -len("/chat/completions")] + "/completions" if chat else req.path
    reshape = Reshape(partial.stamp, chat)
    return Continuation(path, orjson.dumps(ask), len(ids), reshape)


def _by_text(req: GenerationRequest, body: dict[str, Any], partial: Partial) -> Continuation | None:
    """vLLM's ``continue_final_message`` with ``add_generation_prompt=false``: chats only."""
    if not req.path.endswith("/chat/completions"):
        return None
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    body["messages"] = [*messages, {"role": "assistant", "content": partial.text}]
    body["continue_final_message"] = True
    body["add_generation_prompt"] = False
    for name in ("max_tokens", "max_completion_tokens"):
        owed = _owed(body, name, partial.tokens)
        if owed is not None:
            body[name] = owed
    return Continuation(req.path, orjson.dumps(body), partial.tokens)


class Reshape:
    """Turns a continuation's completion chunks into the caller's: a chat chunk for a chat
    (``delta.content`` for ``text``), the answer's own ``id``, ``created`` and ``model`` for
    either, so the caller sees one answer. Runs only on a continued stream's chunks."""

    __slots__ = ("_chat", "_stamp")

    #: Never differs from the answer it continues (a :class:`~.request.Rewrite`).
    diverged: str | None = None
    passed = False

    def __init__(self, stamp: Mapping[str, object], chat: bool) -> None:
        self._stamp = dict(stamp)
        self._chat = chat

    def __call__(self, payloads: list[bytes]) -> list[bytes]:
        return [self.one(p) for p in payloads]

    def one(self, payload: bytes) -> bytes:
        """One chunk in the caller's format."""
        if payload == DONE or payload.startswith(ERROR_PREFIXES):
            return payload
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return payload  # not relayed: the stream counts as cut there
        if not isinstance(chunk, dict):
            return payload
        out: dict[str, Any] = {**chunk, **self._stamp}
        choices = chunk.get("choices")
        if isinstance(choices, list):
            out["choices"] = [self._choice(c) for c in choices if isinstance(c, dict)]
        return orjson.dumps(out)

    def _choice(self, choice: dict[str, Any]) -> dict[str, Any]:
        choice.pop("prompt_token_ids", None)
        if not self._chat:
            return choice
        text = choice.pop("text", None)
        delta = {"content": text} if text else {}
        return {"index": choice.pop("index", 0), "delta": delta, **choice}


def whole_usage(payload: bytes, tokens_before: int) -> bytes:
    """A continuation's usage chunk made to count the whole answer: its prompt held the
    ``tokens_before`` delivered earlier, which are the answer's, not the prompt's. Parsed only
    for a continued stream's usage chunk, never on the ordinary path."""
    try:
        chunk = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload
    usage = chunk.get("usage") if isinstance(chunk, dict) else None
    if not isinstance(usage, dict):
        return payload
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return payload
    usage["prompt_tokens"] = max(0, prompt - tokens_before)
    usage["completion_tokens"] = completion + tokens_before
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return orjson.dumps(chunk)


def tokenize_body(req: GenerationRequest) -> bytes | None:
    """The ``/tokenize`` request (vLLM's) that counts the prompt of ``req`` as its completion
    did, where ``req`` is a stream that asked for usage (``stream_options.include_usage``):
    a chat's messages and tools with the generation prompt, or a completion's prompt string.
    ``None`` otherwise."""
    try:
        body = orjson.loads(req.body)
    except orjson.JSONDecodeError:
        return None
    options = body.get("stream_options") if isinstance(body, dict) else None
    if not isinstance(options, dict) or options.get("include_usage") is not True:
        return None
    ask: dict[str, object] = {"model": body.get("model")}
    if req.path.endswith("/chat/completions") and isinstance(body.get("messages"), list):
        ask["messages"] = body["messages"]
        ask["add_generation_prompt"] = True
        for name in ("tools", "chat_template", "chat_template_kwargs"):
            if name in body:
                ask[name] = body[name]
    elif req.path.endswith("/completions") and isinstance(body.get("prompt"), str):
        ask["prompt"] = body["prompt"]
    else:
        return None
    return orjson.dumps(ask)


def owed_usage(partial: Partial, prompt_tokens: int) -> bytes:
    """The usage chunk a stream that asked for it still owes after the engine dropped it past
    its last token: no choices, the prompt as the engine counts it, the completion by its token
    ids where the engine sent them (else one token per content chunk, as the text continuation
    counts)."""
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": partial.tokens,
        "total_tokens": prompt_tokens + partial.tokens,
    }
    return orjson.dumps({**partial.stamp, "choices": [], "usage": usage})


async def owed_end(
    req: GenerationRequest,
    partial: Partial,
    prompt_tokens: Callable[[bytes], Awaitable[int | None]],
) -> tuple[bytes, ...]:
    """The end a stream still owes when the engine dropped it after its last token: ``[DONE]``,
    after the usage chunk its request asked for where the prompt can be counted: by the ids that
    came with the stream, else by the engine's tokenizer (``prompt_tokens`` of a ``/tokenize``
    body; docs/design.md, Continuation)."""
    ask = None if partial.usage_seen else tokenize_body(req)
    if ask is None:
        return (DONE,)
    ids = partial.prompt_ids  # sent with the stream where the engine sent them: no question
    prompt = len(ids) if ids is not None else await prompt_tokens(ask)
    if prompt is None:
        return (DONE,)
    return (owed_usage(partial, prompt), DONE)
