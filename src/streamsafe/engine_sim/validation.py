"""Checking a completion request as vLLM does, before the engine sees it.

:func:`validate` turns a decoded body into a :class:`Job` or raises :class:`BadRequest` with
vLLM's message and status (400, or 404 for an unknown model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streamsafe.engine_sim.config import SimConfig
from streamsafe.engine_sim.text import count_words, split_continuation
from streamsafe.request_cost import COMPLETIONS_DEFAULT_MAX_TOKENS, InvalidField, read_int
from streamsafe.tokens import estimate_prompt_tokens

__all__ = ["INVALID_PREFILL", "BadRequest", "ContextTooLong", "Job", "validate"]


class BadRequest(Exception):
    """A request vLLM would refuse; ``code`` is the status (default 400), ``name`` the error's
    own code where it has one (the body's ``code`` is the status otherwise)."""

    def __init__(self, message: str, code: int = 400, name: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.name = name


class ContextTooLong(BadRequest):
    """A request past ``max_model_len`` (vLLM's 400, whose ``code`` is the status)."""


#: The ``code`` of the 400 an engine that refuses a prefill gives (``SimConfig.refuse_prefill``).
INVALID_PREFILL = "invalid_prefill"


@dataclass
class Job:
    """A validated completion request."""

    chat: bool
    body: dict[str, Any]
    stream: bool
    include_usage: bool
    prompt_tokens: int
    max_tokens: int


def _int_field(body: Mapping[str, Any], name: str) -> int | None:
    # Read as vLLM's pydantic models read integers: "5000" and 5000.0 are 5000.
    try:
        return read_int(body, name)
    except InvalidField as exc:
        raise BadRequest(str(exc)) from None


def validate(body: Any, chat: bool, cfg: SimConfig) -> Job:
    """The job a chat (``chat``) or completion request ``body`` asks for."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model", cfg.model)
    if not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    if chat:
        _check_messages(body.get("messages"))
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list) or (isinstance(prompt, list) and not prompt):
            raise BadRequest("'prompt' is required: a string or a non-empty list")
    stream, include_usage = _streaming(body)
    asked = _int_field(body, "max_completion_tokens") if chat else None
    if asked is None:
        asked = _int_field(body, "max_tokens")
    # A continuation's prompt is the original prompt plus the partial answer, whose words are
    # the tokens generated before (one token per word, the text rule), as vLLM's tokenizer
    # gives back the tokens it generated.
    split = split_continuation(body)
    generated = 0 if split is None else count_words(split[1])
    prompt_tokens = estimate_prompt_tokens(body if split is None else split[0]) + generated
    # vLLM's default is the context left after the prompt, so it shrinks by what a continued
    # answer already generated.
    if asked is None and not chat:
        asked = COMPLETIONS_DEFAULT_MAX_TOKENS  # vLLM's (and OpenAI's) for /v1/completions
    max_tokens = max(1, cfg.default_max_tokens - generated) if asked is None else asked
    if max_tokens < 1:
        raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
    n = _int_field(body, "n")
    if n is not None and n != 1:
        raise BadRequest("the simulator serves n=1 only")
    if cfg.refuse_prefill and _is_prefill(body, chat):
        # Before the model: the request's shape is refused whichever model it names.
        raise BadRequest(
            "This engine does not continue a partial answer: the last message may not be the "
            "assistant's (continue_final_message), nor the prompt token ids.",
            name=INVALID_PREFILL,
        )
    if model != cfg.model:
        raise BadRequest(f"The model `{model}` does not exist.", 404)
    limit = cfg.max_model_len
    if limit is not None:
        if asked is None:
            max_tokens = max(1, min(max_tokens, limit - prompt_tokens))
        if prompt_tokens + max_tokens > limit:
            raise ContextTooLong(_too_long(limit, prompt_tokens, max_tokens, chat))
    return Job(chat, body, stream, include_usage, prompt_tokens, max_tokens)


def _check_messages(messages: Any) -> None:
    """A chat's messages as vLLM takes them: a non-empty list of objects with a role, each
    content a string or a list of typed parts."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' is required: a non-empty list of messages")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a 'role'")
        content = msg.get("content")
        if content is not None and not isinstance(content, str | list):
            raise BadRequest(f"messages[{i}].content must be a string or a list of parts")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise BadRequest(f"messages[{i}].content[{j}] must be an object with a 'type'")
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise BadRequest(f"messages[{i}].content[{j}].text must be a string")


def _streaming(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """Whether the request streams, and whether its stream ends with the usage."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object")
    include_usage = bool(options and options.get("include_usage"))
    if options is not None and not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.")
    return stream, include_usage


def _is_prefill(body: Mapping[str, Any], chat: bool) -> bool:
    """A chat whose last message is the assistant's, or a completion whose prompt is token ids:
    a partial answer to continue."""
    if not chat:
        prompt = body.get("prompt")
        return isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    return isinstance(last, Mapping) and last.get("role") == "assistant"


def _too_long(limit: int, prompt_tokens: int, max_tokens: int, chat: bool) -> str:
    """vLLM's message for a request past ``--max-model-len``."""
    where = "messages" if chat else "prompt"
    return (
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {where}, {max_tokens} in "
        f"the completion). Please reduce the length of the {where} or completion."
    )
