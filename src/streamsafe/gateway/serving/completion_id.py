"""A completion id of one's own for a call that shares another's generation by being identical
to it (``collapse_identical``): two callers, two answers, as far as ids go.

Replayed bytes carry the engine's ``id``. Where the two callers are distinct (behind Llama
Stack: two client calls, or a client's retry that Llama Stack sends as a fresh call), each
stores its answer under that id, and Llama Stack's store refuses the second (a UNIQUE
constraint: its OpenAI chat route fails with a 500). A retry marked as one, a key's replay or a
resume is the same caller: it keeps the id. Only the leading ``"id"`` of a payload is changed
(vLLM and OpenAI put it first); a payload without one passes as it is.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable

__all__ = ["own_completion_id"]

_LEADING_ID = re.compile(rb'^(\{\s*"id"\s*:\s*"[^"\\]*)"')


def own_completion_id(suffix: bytes | None = None) -> Callable[[bytes], bytes]:
    """What rewrites each payload of one subscriber: ``-<suffix>`` (random where not given)
    after its completion id, the same for every payload, so its chunks still share one id."""
    tail = b"-" + (suffix if suffix is not None else secrets.token_hex(4).encode()) + b'"'

    def rename(payload: bytes) -> bytes:
        return _LEADING_ID.sub(lambda m: m.group(1) + tail, payload, count=1)

    return rename
