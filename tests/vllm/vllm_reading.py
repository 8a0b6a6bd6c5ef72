"""Runs under the vLLM virtualenv's Python: reads request bodies as vLLM 0.32's own request
models read them. One JSON line in ({"chat": bool, "body": {...}}), one JSON line out: the cost
fields as vLLM's model holds them ({"max_tokens", "max_completion_tokens", "n", "prompts"}), or
{"refused": true} where vLLM answers 400 (its pydantic validation, or its "at least 1" checks
for a limit or n below what it accepts)."""

from __future__ import annotations

import json
import sys
import warnings

warnings.simplefilter("ignore")

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.entrypoints.openai.completion.protocol import CompletionRequest  # noqa: E402


def _prompts(prompt: object) -> int:
    # vLLM runs one generation per prompt of a list of strings or of token-id lists.
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1


def read(chat: bool, body: dict[str, object]) -> dict[str, object]:
    try:
        req = ChatCompletionRequest(**body) if chat else CompletionRequest(**body)
    except Exception:
        return {"refused": True}
    completion = getattr(req, "max_completion_tokens", None) if chat else None
    limit = completion if completion is not None else req.max_tokens
    if (limit is not None and limit < 0) or (req.n is not None and req.n < 1):
        return {"refused": True}  # SamplingParams: "... must be at least 1"
    return {
        "max_tokens": limit,
        "n": 1 if req.n is None else req.n,
        "prompts": 1 if chat else _prompts(req.prompt),
    }


for line in sys.stdin:
    asked = json.loads(line)
    print(json.dumps(read(asked["chat"], asked["body"])), flush=True)
