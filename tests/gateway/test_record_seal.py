"""What a generation's Redis record holds of its prompt and its provider data (issue 23, row
12): both were there in clear (provider API keys in ``X-LlamaStack-Provider-Data``), for up to
an hour after an owner's death. Pure: records are built and read back without Redis."""

from __future__ import annotations

import pytest

from streamsafe.gateway.generations.generation import Generation, GenerationRequest
from streamsafe.gateway.generations.store import MemoryEventLog
from streamsafe.gateway.replicas.generation_record import record_of, request_of
from streamsafe.gateway.replicas.record_seal import RecordSeal, Unsealable

PROMPT = b'{"model":"m","messages":[{"role":"user","content":"my private question"}]}'
PROVIDER = b'x-llamastack-provider-data: {"together_api_key": "sk-provider-secret"}\r\n'


def _gen(gen_id: str = "gen-1", forward: bytes = PROVIDER) -> Generation:
    req = GenerationRequest(
        tenant="t-1",
        path="/v1/chat/completions",
        body=PROMPT,
        fingerprint=b"f" * 16,
        cost=10,
        stream=True,
        forward=forward,
    )
    return Generation(gen_id, req, MemoryEventLog(), None, 0.0)


def _stored(record: dict[str, bytes | str | int]) -> dict[str, bytes]:
    """The record as Redis hands it back (every value bytes)."""
    return {k: v if isinstance(v, bytes) else str(v).encode() for k, v in record.items()}


def _clear_text(record: dict[str, bytes]) -> bytes:
    return b"".join(record.values())


def test_with_a_shared_secret_prompt_and_provider_data_are_sealed_and_read_back() -> None:
    seal = RecordSeal("fleet-secret")
    record = _stored(record_of(_gen(), seal))
    assert b"private question" not in _clear_text(record)
    assert b"sk-provider-secret" not in _clear_text(record)
    request = request_of(record, "gen-1", RecordSeal("fleet-secret"))  # another replica
    assert request.body == PROMPT and request.forward == PROVIDER and not request.withheld


def test_without_a_secret_provider_data_never_reaches_redis() -> None:
    record = _stored(record_of(_gen()))
    assert b"sk-provider-secret" not in _clear_text(record)
    request = request_of(record, "gen-1")
    assert request.withheld and request.forward == b""
    assert request.body == PROMPT  # another replica needs the prompt to continue it
    plain = request_of(_stored(record_of(_gen(forward=b""))), "gen-1")
    assert not plain.withheld


def test_a_sealed_field_opens_only_with_its_secret_and_in_its_own_record() -> None:
    record = _stored(record_of(_gen("gen-1"), RecordSeal("fleet-secret")))
    with pytest.raises(Unsealable):
        request_of(record, "gen-1", RecordSeal("another secret"))
    with pytest.raises(Unsealable):
        request_of(record, "gen-1")  # a replica given no secret
    with pytest.raises(Unsealable):
        request_of(record, "gen-2", RecordSeal("fleet-secret"))  # copied into another record
    with pytest.raises(ValueError):
        RecordSeal("")
