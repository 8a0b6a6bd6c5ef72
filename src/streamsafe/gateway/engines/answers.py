"""What the gateway passes on in place of an engine's answer: an engine's refusal read whole
(:class:`Refused`), one the gateway makes itself (:func:`made_refusal`), and either as a response
read whole (:func:`answer_response`)."""

from __future__ import annotations

from dataclasses import dataclass

from streamsafe.gateway.engines.pool import Unavailable
from streamsafe.gateway.errors import error_body
from streamsafe.gateway.upstream.transport import Answer

__all__ = ["Refused", "answer_response", "made_refusal", "unavailable"]


@dataclass(frozen=True, slots=True)
class Refused:
    """An answer other than 200 that the relay passes on (or acts on): its status, its body
    (bounded) and its ``Retry-After`` header as sent."""

    status: int
    body: bytes
    retry_after: str | None = None


def answer_response(refused: Refused) -> Answer:
    """A response the gateway passes on in place of an upstream one (its body already read, or
    made up here)."""
    headers = [(b"content-type", b"application/json")]
    if refused.retry_after is not None:
        headers.append((b"retry-after", refused.retry_after.encode("latin-1")))
    return Answer(refused.status, headers, refused.body)


def made_refusal(status: int, message: str, kind: str, retry_after: float | None = None) -> Refused:
    """A refusal of the gateway's own: an OpenAI error body, ``Retry-After`` in whole seconds
    (rounded up, at least 1) where given."""
    seconds = None if retry_after is None else str(max(1, int(retry_after + 0.999)))
    return Refused(status, error_body(message, kind, status), seconds)


def unavailable(model: str, pick: Unavailable, silent: bool) -> Refused:
    """The answer where no engine of ``model`` (or its fallbacks) can take an attempt: 404 where
    none serves it, 504 where one held this request silent past the first-token timeout
    (``silent``), else 503 with the ``Retry-After`` of the first engine back."""
    if not pick.known:
        return made_refusal(404, f"no engine serves model {model!r}", "not_found_error")
    if silent:
        msg = f"no engine of {model!r} sent a first token within the first-token timeout"
        return made_refusal(504, msg, "upstream_error")
    msg = f"every engine of {model!r} is down; retry after {pick.retry_after:.0f} s"
    return made_refusal(503, msg, "service_unavailable", max(1.0, pick.retry_after))
