"""Token estimates shared by the engine simulator and the gateway's admission control.

Neither part has a tokenizer, and both must agree on what a request costs, so the rule is simple
and documented: one token per 4 bytes of UTF-8 text, rounded up, plus 4 tokens of framing per chat
message (role markers) and 2 for the assistant's reply header. Close to what BPE tokenizers give
for English prose; exact agreement between the two parts matters more than realism.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "completion_prompts",
    "content_text",
    "estimate_input_tokens",
    "estimate_prompt_tokens",
    "estimate_text_tokens",
    "prompt_text",
]

_PER_MESSAGE = 4
_REPLY_HEADER = 2


def estimate_text_tokens(text: str) -> int:
    """Tokens in ``text``: ceil(utf-8 bytes / 4)."""
    return (len(text.encode()) + 3) // 4


def content_text(content: Any) -> str:
    """The text of a chat message's ``content``: the string itself, or the string ``text`` of
    each part of a list of parts joined; anything else is no text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        # Only string texts count: a request's shape is checked where it is received (with an
        # error naming the field); an estimate must never be the thing that fails.
        texts = (part.get("text") for part in content if isinstance(part, Mapping))
        return "".join(t for t in texts if isinstance(t, str))
    return ""


def prompt_text(body: Mapping[str, Any]) -> str:
    """The prompt as one string: the completion ``prompt`` or the chat messages' contents joined
    with their roles. Deterministic, so it can seed deterministic output."""
    if "messages" in body:
        parts = []
        for msg in body.get("messages") or ():
            if isinstance(msg, Mapping):
                parts.append(f"{msg.get('role', '')}: {content_text(msg.get('content'))}")
        return "\n".join(parts)
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        return "\n".join(str(p) for p in prompt)
    return str(prompt)


def completion_prompts(prompt: Any) -> list[str | list[Any]]:
    """The prompts of a completions ``prompt``, one generation each (as vLLM runs them): a
    string, a list of strings, a list of token ids (one prompt), or a list of token-id lists.
    Anything else reads as one empty prompt: a request's shape is checked where it is
    received, never by an estimate."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, list | str):
            return [p if isinstance(p, list | str) else str(p) for p in prompt]
        return [prompt]  # one prompt of token ids
    return [""]


def _one_prompt_tokens(prompt: str | list[Any]) -> int:
    # Token ids are tokens; text follows the module rule.
    return len(prompt) if isinstance(prompt, list) else max(1, estimate_text_tokens(prompt))


def estimate_prompt_tokens(body: Mapping[str, Any]) -> int:
    """Prompt tokens of a chat or completion request body (see the module rule), every prompt
    of a completions ``prompt`` list summed, token ids counted one token each."""
    if "messages" in body:
        total = _REPLY_HEADER
        for msg in body.get("messages") or ():
            if isinstance(msg, Mapping):
                total += _PER_MESSAGE + estimate_text_tokens(content_text(msg.get("content")))
        return total
    return sum(_one_prompt_tokens(p) for p in completion_prompts(body.get("prompt")))


#: Fields of a request that name, but are not, its input.
_NOT_INPUT = frozenset(
    ("model", "encoding_format", "user", "truncate_prompt_tokens", "priority", "request_id")
)


def estimate_input_tokens(body: Mapping[str, Any]) -> int:
    """Input tokens of a request with no single prompt field (embeddings' ``input``, rerank's
    ``query`` and ``documents``, score's ``text_1`` and ``text_2``, a pooling ``messages``):
    every string in the body counted by :func:`estimate_text_tokens` and every integer in a
    list as one token id, outside the fields that name a setting (``model``, ...). An
    over-estimate where settings are strings, never an under-estimate of the text sent."""
    total = 0
    stack: list[Any] = [v for k, v in body.items() if k not in _NOT_INPUT]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            total += estimate_text_tokens(value)
        elif isinstance(value, Mapping):
            stack.extend(value.values())
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, int) and not isinstance(item, bool):
                    total += 1
                else:
                    stack.append(item)
    return total
