"""The simulator's deterministic text: every generated token is one short word chosen from a fixed
vocabulary by a hash of (prompt, seed, position), so the text depends on nothing else (not on
timing, batch, retries or which attempt served it) and a replayed or resumed stream can be checked
token for token with :func:`expected_text`.

The token rule: token ``i`` is ``VOCABULARY[blake2b(key + i)[0]]`` where ``key`` is a blake2b
digest of the seed and the prompt text (:func:`streamsafe.tokens.prompt_text`); token 0 is the bare
word, every later token is a space then the word. The text of ``n`` tokens therefore has exactly
``n`` words, which is how a partial answer is counted back into a position.

Resuming: a chat request with ``continue_final_message: true`` whose last message is the assistant's
partial answer continues the same text. Its key is the prompt without that last message and its
first new token is at position ``words in the partial answer``, so
``partial + continuation == expected_text(original, n)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from streamsafe.tokens import content_text, prompt_text

__all__ = ["VOCABULARY", "TextStream", "expected_text", "split_continuation", "text_origin"]

_WORDS = """
    the of and to in is was for on that with as by at from his her it an are were be this
    which have had not but or they one all their there has been would will what who she more
    when out can we him so up its about into than them only other time new some could these
    two may then first any like now my such over our man me even most made after also did many
    off before must well back through years much where your way down should because each just
    those people how too little state good very make world still own see men work long get
    here between both life being under never day same another know while last might us great
    old year come since against go came right used take three states himself few house use
    during without again place around however home small found thought went say part once
    general high upon school every does got united left number course war until always away
    something fact though water less public put think almost hand enough far took head yet
    government system better set told nothing night end why called find going look asked later
    knew point next city business give group toward young days let room president side social
    given present several order national possible rather second face per among form important
    often things looked early white case become large big need four within felt along children
    saw best church ever least power development light
"""

#: 256 short English words: one byte of hash picks one, and none needs JSON escaping.
VOCABULARY: tuple[str, ...] = tuple(_WORDS.split())

assert len(VOCABULARY) == 256 and all(w.isascii() and w.isalpha() for w in VOCABULARY)

# Bytes as they appear inside a JSON string: token 0 bare, later tokens with a leading space.
_FIRST = tuple(w.encode() for w in VOCABULARY)
_LATER = tuple(b" " + w for w in _FIRST)


def text_key(prompt: str, seed: int) -> bytes:
    """The per-request hash key of the token rule."""
    return hashlib.blake2b(f"{seed}\x00{prompt}".encode(), digest_size=16).digest()


def token_bytes(key: bytes, position: int) -> bytes:
    """Token ``position`` of the text keyed by ``key``, as UTF-8 (JSON-safe as is)."""
    index = hashlib.blake2b(key + position.to_bytes(8, "little"), digest_size=1).digest()[0]
    return _LATER[index] if position else _FIRST[index]


def count_words(text: str) -> int:
    """Tokens in a text made by the token rule: its word count."""
    return len(text.split())


def split_continuation(body: Mapping[str, Any]) -> tuple[Mapping[str, Any], str] | None:
    """(the request without its partial answer, the partial answer's text) for a continuation
    request (``continue_final_message`` with an assistant message last); ``None`` otherwise."""
    messages = body.get("messages")
    if (
        body.get("continue_final_message") is True
        and isinstance(messages, list)
        and messages
        and isinstance(messages[-1], Mapping)
        and messages[-1].get("role") == "assistant"
    ):
        return {**body, "messages": messages[:-1]}, content_text(messages[-1].get("content"))
    return None


def text_origin(body: Mapping[str, Any]) -> tuple[str, int]:
    """(prompt text that keys the output, position of the first new token) for a request body."""
    split = split_continuation(body)
    if split is not None:
        original, partial = split
        return prompt_text(original), count_words(partial)
    return prompt_text(body), 0


class TextStream:
    """The tokens of one request, from its first new position on."""

    __slots__ = ("key", "start")

    def __init__(self, body: Mapping[str, Any], seed: int) -> None:
        prompt, self.start = text_origin(body)
        self.key = text_key(prompt, seed)

    def token(self, index: int) -> bytes:
        """The ``index``-th generated token of this request (0 = first new token)."""
        return token_bytes(self.key, self.start + index)

    def text(self, n_tokens: int) -> str:
        """The first ``n_tokens`` generated tokens as one string."""
        return b"".join(self.token(i) for i in range(n_tokens)).decode()


def expected_text(body: Mapping[str, Any], n_tokens: int, seed: int = 0) -> str:
    """Exactly the text the simulator (seeded with ``seed``) generates for this request body in its
    first ``n_tokens`` tokens: the check for replayed and resumed streams."""
    return TextStream(body, seed).text(n_tokens)
