"""Typed results: attribute access over the parsed JSON, without copying or validating it.

A result wraps the dict ``orjson`` produced and wraps nested values only when they are read, so
turning a stream chunk into an object costs one small allocation. ``chunk.choices[0].delta.content``
works as with openai-python; a field the server did not send reads as ``None`` (as an unset
optional field of openai-python's models); ``to_dict()`` gives the plain dict back.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import orjson

__all__ = [
    "APIObject",
    "ChatCompletion",
    "ChatCompletionChunk",
    "Completion",
    "CreateEmbeddingResponse",
    "Model",
    "ModelList",
    "Response",
    "ResponseStreamEvent",
]


def _wrap(value: Any) -> Any:
    cls = type(value)
    if cls is dict:
        return APIObject(value)
    if cls is list:
        return _List(value)
    return value


class APIObject:
    """Attribute access over a JSON object; ``obj["key"]`` and ``obj.get`` work too."""

    __slots__ = ("_data",)

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _wrap(self._data.get(name))

    def __getitem__(self, key: str) -> Any:
        return _wrap(self._data[key])

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: str, default: Any = None) -> Any:
        """The field ``key`` (wrapped), or ``default``."""
        return _wrap(self._data.get(key, default))

    def to_dict(self) -> dict[str, Any]:
        """The parsed JSON object itself (not a copy)."""
        return self._data

    def to_json(self) -> str:
        """The object as JSON text."""
        return orjson.dumps(self._data).decode()

    def model_dump(self, **_: Any) -> dict[str, Any]:
        """A copy of the object as plain data (openai-python's pydantic spelling; its options
        are accepted and ignored: every field the server sent is in it, as sent)."""
        return copy.deepcopy(self._data)

    def model_dump_json(self, **_: Any) -> str:
        """The object as JSON text (openai-python's pydantic spelling)."""
        return self.to_json()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, APIObject):
            return self._data == other._data
        if isinstance(other, dict):
            return self._data == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._data!r})"


class _List:
    """A JSON array whose items are wrapped when read."""

    __slots__ = ("_items",)

    def __init__(self, items: list[Any]) -> None:
        self._items = items

    def __getitem__(self, index: int) -> Any:
        return _wrap(self._items[index])

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Any]:
        return map(_wrap, self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _List):
            return self._items == other._items
        if isinstance(other, list):
            return self._items == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def to_list(self) -> list[Any]:
        """The parsed JSON array itself."""
        return self._items

    def __repr__(self) -> str:
        return repr(self._items)


class ChatCompletion(APIObject):
    """A ``chat.completion``: ``choices[i].message.content``, ``usage``, ..."""

    __slots__ = ()


class ChatCompletionChunk(APIObject):
    """A ``chat.completion.chunk`` of a stream: ``choices[i].delta.content``, ``finish_reason``."""

    __slots__ = ()


class Completion(APIObject):
    """A ``text_completion`` (whole or one chunk of a stream): ``choices[i].text``."""

    __slots__ = ()


class Model(APIObject):
    """One entry of ``models.list()``: ``id``, ``owned_by``, ..."""

    __slots__ = ()


class ModelList(APIObject):
    """The result of ``models.list()``: ``data`` (a list of :class:`Model`); iterable."""

    __slots__ = ()

    def __iter__(self) -> Iterator[Model]:
        items = self._data.get("data") or []
        return (Model(m) if type(m) is dict else m for m in items)

    def __len__(self) -> int:
        return len(self._data.get("data") or [])


class CreateEmbeddingResponse(APIObject):
    """The result of ``embeddings.create()``: ``data[i].embedding`` (a list of floats, or a
    base64 string where ``encoding_format="base64"`` was asked), ``model``, ``usage``."""

    __slots__ = ()


def output_text_of(data: dict[str, Any]) -> str:
    """The text of every ``output_text`` part of a Responses API object's ``output`` messages,
    joined (openai-python's ``Response.output_text``)."""
    parts: list[str] = []
    output = data.get("output")
    for item in output if type(output) is list else []:
        content = item.get("content") if type(item) is dict else None
        for part in content if type(content) is list else []:
            if type(part) is dict and part.get("type") == "output_text":
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
    return "".join(parts)


class Response(APIObject):
    """A Responses API ``response``: ``id``, ``status``, ``output`` (a list of items), ``usage``,
    and ``output_text``, the text of its output messages joined, as openai-python has it."""

    __slots__ = ()

    @property
    def output_text(self) -> str:
        """The text of every ``output_text`` part of the output messages, joined."""
        return output_text_of(self._data)


class ResponseStreamEvent(APIObject):
    """One event of a streamed Responses API call: ``type`` (``response.created``,
    ``response.output_text.delta`` with its ``delta``, ..., ``response.completed`` carrying the
    whole ``response``), ``sequence_number``."""

    __slots__ = ()
