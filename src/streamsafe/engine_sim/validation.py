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
from streamsafe.tokens import estimate_prompt_tokens

__all__ = ["BadRequest", "Job", "validate"]


class BadRequest(Exception):
    """A request vLLM would refuse; ``code`` is the status (default 400)."""

    def __init__(self, message: str, code: int = 400) -> None:
        super().__init__(message)
        self.code = code


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
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer, got {value!r}")
    return value


def validate(body: Any, chat: bool, cfg: SimConfig) -> Job:
    """The job a chat (``chat``) or completion request ``body`` asks for."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model", cfg.model)
    if not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    if chat:
        messages = body.get("messages")
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
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list) or (isinstance(prompt, list) and not prompt):
            raise BadRequest("'prompt' is required: a string or a non-empty list")
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
    max_tokens = _int_field(body, "max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens")
    # A continuation's prompt is the original prompt plus the partial answer, whose words are
    # the tokens generated before (one token per word, the text rule), as vLLM's tokenizer
    # gives back the tokens it generated.
    split = split_continuation(body)
    generated = 0 if split is None else count_words(split[1])
    prompt_tokens = estimate_prompt_tokens(body if split is None else split[0]) + generated
    if max_tokens is None:
        # vLLM's default is the context left after the prompt, so it shrinks by what a
        # continued answer already generated.
        max_tokens = max(1, cfg.default_max_tokens - generated)
    if max_tokens < 1:
        raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
    n = _int_field(body, "n")
    if n is not None and n != 1:
        raise BadRequest("the simulator serves n=1 only")
    if model != cfg.model:
        raise BadRequest(f"The model `{model}` does not exist.", 404)
    return Job(chat, body, stream, include_usage, prompt_tokens, max_tokens)
