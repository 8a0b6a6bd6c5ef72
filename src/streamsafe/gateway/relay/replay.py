"""Replay and verify: the continuation of a stream whose engine state is more than its tokens
(see :mod:`.continuation_plan` and docs/design.md, Continuation).

The engine is asked for the whole answer again, the request as it was. Its stream is compared
with what the caller already has, the answer's text (content and tool-call arguments) character
for character and its token ids where the log has them; chunks inside that part are dropped,
the chunk that crosses its end is cut to what is new (text, token ids and logprobs), and from
there on chunks pass untouched, unparsed. The first difference ends the stream with an error
(:attr:`Replay.diverged`), never a stitched answer. The replay's own usage counts the whole
answer, so it passes as it comes.
"""

from __future__ import annotations

from typing import Any

import orjson

from streamsafe.gateway.errors import ERROR_PREFIXES
from streamsafe.sse import DONE

__all__ = ["Replay", "answer_pieces"]


def answer_pieces(choice: dict[str, Any]) -> tuple[str, list[int] | None]:
    """What one choice of a chunk adds to the answer: its text (a chat delta's content and
    tool-call arguments, a completion's text) and its token ids (``None`` where it came
    without them). The same reading for the log and the replay, so equal answers compare
    equal."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        text = delta.get("content") or ""
        for call in delta.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                text += function.get("arguments") or ""
    else:
        text = choice.get("text") or ""
    ids = choice.get("token_ids")
    if not (isinstance(ids, list) and all(type(i) is int for i in ids)):
        ids = None
    return (text if isinstance(text, str) else ""), ids


class Replay:
    """Rewrites a replayed stream's reads: drops what the caller has (``text``, ``ids``), cuts
    the chunk that crosses its end, passes the rest. ``diverged`` says why the replay differs
    from it (the stream must then end with that error); ``passed``: the delivered part is behind,
    every later read passes as it is."""

    __slots__ = ("_ids", "_seen_ids", "_seen_text", "_text", "diverged", "passed")

    def __init__(self, text: str, ids: list[int] | None) -> None:
        self._text = text
        self._ids = ids
        self._seen_text = 0
        self._seen_ids = 0
        self.diverged: str | None = None
        self.passed = False

    def __call__(self, payloads: list[bytes]) -> list[bytes]:
        if self.passed:
            return payloads
        out: list[bytes] = []
        for i, payload in enumerate(payloads):
            if self.passed or payload.startswith(ERROR_PREFIXES):
                out.append(payload)  # an error event is the engine's, taken as any
                continue
            if payload == DONE:
                self.diverged = "the replayed answer ended before the part already delivered"
                return out
            kept = self._chunk(payload)
            if self.diverged is not None:
                return out
            if kept is not None:
                out.append(kept)
            if self.passed:
                out.extend(payloads[i + 1 :])
                return out
        return out

    def _chunk(self, payload: bytes) -> bytes | None:
        try:
            chunk = orjson.loads(payload)
            choices = chunk["choices"]
            choice = choices[0] if choices else None
        except (orjson.JSONDecodeError, KeyError, TypeError, IndexError):
            return payload  # not an answer's chunk: the sink judges it
        if not isinstance(choice, dict):
            return None  # a chunk with no choice before the end (usage comes last)
        text, ids = answer_pieces(choice)
        cut_text = self._match_text(text)
        cut_ids = self._match_ids(ids)
        if self.diverged is not None:
            return None
        if self._seen_text >= len(self._text) and self._seen_ids >= self._owed_ids():
            self.passed = True
        elif choice.get("finish_reason"):
            self.diverged = "the replayed answer ended before the part already delivered"
            return None
        # What is new in the chunk goes out; its text and its ids may pass the delivered part's
        # ends in different chunks (the engine holds text back, as for a stop string, while
        # the ids go out), so each is cut on its own.
        # Where the delivered ids are unknown, a chunk is new by its text alone.
        counted = ids if self._ids is not None else None
        if cut_text == 0 and cut_ids == 0 and (text or counted or self.passed):
            return payload
        _trim(choice, cut_text, cut_ids)
        new_ids = choice.get("token_ids") if counted else None
        if not (text[cut_text:] or new_ids or choice.get("finish_reason")):
            return None  # nothing new in it
        return orjson.dumps(chunk)

    def _owed_ids(self) -> int:
        return len(self._ids) if self._ids is not None else 0

    def _match_text(self, text: str) -> int:
        """How many characters of ``text`` the caller already has (checked against them)."""
        start, want = self._seen_text, self._text
        overlap = min(len(text), max(0, len(want) - start))
        if text[:overlap] != want[start : start + overlap]:
            self.diverged = (
                f"the replayed answer differs from the one delivered at character {start}"
            )
        self._seen_text += len(text)
        return overlap

    def _match_ids(self, ids: list[int] | None) -> int:
        """How many of ``ids`` the caller already has (checked against them)."""
        want = self._ids
        if want is None or not ids:
            return 0
        start = self._seen_ids
        overlap = min(len(ids), max(0, len(want) - start))
        if ids[:overlap] != want[start : start + overlap]:
            self.diverged = f"the replayed answer differs from the one delivered at token {start}"
        self._seen_ids += len(ids)
        return overlap


def _trim(choice: dict[str, Any], chars: int, tokens: int) -> None:
    """Cut the first ``chars`` characters of a choice's text and its first ``tokens`` tokens
    (ids and logprobs) off, in place: the caller has them. A tool call whose arguments were cut
    into was announced already: its id, type and name go too."""
    if chars:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            if content:
                taken = min(chars, len(content))
                delta["content"] = content[taken:]
                chars -= taken
            for call in delta.get("tool_calls") or ():
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or chars <= 0:
                    continue
                arguments = function.get("arguments") or ""
                taken = min(chars, len(arguments))
                function["arguments"] = arguments[taken:]
                chars -= taken
                call.pop("id", None)
                call.pop("type", None)
                function.pop("name", None)
        elif isinstance(choice.get("text"), str):
            choice["text"] = choice["text"][chars:]
    if tokens:
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            choice["token_ids"] = ids[tokens:]
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            for name, value in logprobs.items():  # chat's content; a completion's lists
                if isinstance(value, list):
                    logprobs[name] = value[tokens:]
