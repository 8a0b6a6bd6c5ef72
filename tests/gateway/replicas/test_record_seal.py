"""What a generation's Redis record holds of its prompt and its provider data (issue 23, row
12): both were there in clear (provider API keys in ``X-LlamaStack-Provider-Data``), for up to
an hour after an owner's death; and (issue 33, row 7) of its idempotency key, its answer's log
entries and the names of its keys. Pure: records are built and read back without Redis."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.generations.store import MemoryEventLog
from streamsafe.gateway.replicas.generation_record import key_of, record_of, request_of
from streamsafe.gateway.replicas.record_seal import (
    SEALED,
    RecordSeal,
    Unreadable,
    Unsealable,
    key_name,
)
from streamsafe.gateway.upstream.kinds import KINDS, CompletionRoute, Wire

pytestmark = pytest.mark.unit

PROMPT = b'{"model":"m","messages":[{"role":"user","content":"my private question"}]}'
PROVIDER = b'x-llamastack-provider-data: {"together_api_key": "sk-provider-secret"}\r\n'


KEY = "k\x00t-1\x00my-idempotency-key"


def _gen(gen_id: str = "gen-1", forward: bytes = PROVIDER) -> Generation:
    req = GenerationRequest(
        tenant="t-1",
        path="/v1/chat/completions",
        body=PROMPT,
        fingerprint=b"f" * 16,
        cost=10,
        stream=True,
        forward=forward,
        route=KINDS["vllm"].route("/v1/chat/completions"),
    )
    return Generation(gen_id, req, MemoryEventLog(), KEY, 0.0)


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


def test_with_a_secret_the_key_and_the_fingerprint_are_sealed_and_read_back() -> None:
    record = _stored(record_of(_gen(), RecordSeal("fleet-secret")))
    assert b"my-idempotency-key" not in _clear_text(record)
    assert b"f" * 16 not in _clear_text(record)  # an unkeyed hash of the prompt
    other = RecordSeal("fleet-secret")  # another replica
    assert key_of(record, "gen-1", other) == KEY
    assert request_of(record, "gen-1", other).fingerprint == b"f" * 16
    with pytest.raises(Unsealable):
        key_of(record, "gen-1", RecordSeal("another secret"))
    plain = _stored(record_of(_gen()))  # without a secret, as before
    assert key_of(plain, "gen-1") == KEY and request_of(plain, "gen-1").fingerprint == b"f" * 16


def test_log_entries_are_sealed_for_their_generation_and_offset() -> None:
    seal, other = RecordSeal("fleet-secret"), RecordSeal("fleet-secret")
    payloads = [b'{"content":"the answer"}', b'{"content":"the answer"}', b"[DONE]"]
    sealed = seal.seal_entries(b"gen-1", 5, payloads)
    assert all(b"answer" not in entry and b"DONE" not in entry for entry in sealed)
    assert sealed[0] != sealed[1]  # the same event twice: two nonces
    assert len({entry[:12] for entry in sealed + seal.seal_entries(b"gen-1", 5, payloads)}) == 6
    assert [other.open_entry(b"gen-1", 5 + i, e) for i, e in enumerate(sealed)] == payloads
    with pytest.raises(Unsealable, match="gen-1"):
        other.open_entry(b"gen-1", 6, sealed[0])  # moved to another offset
    with pytest.raises(Unsealable, match="gen-2"):
        other.open_entry(b"gen-2", 5, sealed[0])  # copied into another log
    with pytest.raises(Unsealable):
        RecordSeal("another secret").open_entry(b"gen-1", 5, sealed[0])


def test_key_names_are_hashes_keyed_by_the_secret() -> None:
    names = {
        key_name(KEY, None),
        key_name(KEY, RecordSeal("fleet-secret")),
        key_name(KEY, RecordSeal("another secret")),
    }
    assert len(names) == 3
    assert all("my-idempotency-key" not in n and len(n) == 32 for n in names)
    assert key_name(KEY, RecordSeal("fleet-secret")) == key_name(KEY, RecordSeal("fleet-secret"))
    assert key_name(KEY, None) != key_name(KEY + "x", None)


_ROUTES = st.builds(
    CompletionRoute,
    path=st.sampled_from(["/v1/chat/completions", "/v1/messages", "/v1/inference/chat-completion"]),
    upstream_path=st.text(max_size=20),
    wire=st.sampled_from(list(Wire)),
    upstream_done=st.booleans(),
    client_done=st.booleans(),
    preamble=st.integers(0, 3),
    token_ids=st.booleans(),
)
_REQUESTS = st.builds(
    GenerationRequest,
    tenant=st.text(max_size=10),
    path=st.text(min_size=1, max_size=30),
    # A JSON body (empty once a kept generation let its prompt go), header lines and a header
    # value never begin as a sealed field does (with a NUL byte).
    body=st.binary(max_size=64).filter(lambda b: not b.startswith(SEALED)),
    fingerprint=st.binary(min_size=16, max_size=16),
    cost=st.integers(0, 10**7),
    stream=st.booleans(),
    idempotency_key=st.none() | st.text(min_size=1, max_size=20).filter(lambda k: k[0] != "\x00"),
    retry=st.booleans(),
    last_event_id=st.none() | st.integers(0, 10**6),
    no_upstream_retry=st.booleans(),
    route=_ROUTES,
    forward=st.binary(max_size=40).filter(lambda b: not b.startswith(SEALED)),
    deterministic=st.booleans(),
    withheld=st.booleans(),
    model=st.text(max_size=12),
)


@settings(max_examples=200)
@given(_REQUESTS, st.booleans())
def test_a_record_holds_its_request_whole(request: GenerationRequest, shared: bool) -> None:
    """Every field of the request comes back from the record, by name: with a shared secret
    exactly; without one, the provider data withheld (never in Redis), all else exactly."""
    seal = RecordSeal("fleet-secret") if shared else None
    gen = Generation("gen-1", request, MemoryEventLog(), "key", 0.0)
    record = _stored(record_of(gen, seal))
    back = request_of(record, "gen-1", RecordSeal("fleet-secret") if shared else None)
    if shared:
        assert back == request
    else:
        withheld = request.withheld or bool(request.forward)
        assert back == dataclasses.replace(request, forward=b"", withheld=withheld)
        assert not request.forward or request.forward not in record.get("forward", b"")
    assert key_of(record, "gen-1", seal and RecordSeal("fleet-secret")) == "key"


@pytest.mark.parametrize("route", [None, "absent"])
def test_a_record_without_a_route_is_unreadable(route: str | None) -> None:
    """Every request has its route: a record that names none (or leaves it out) is malformed,
    never a request whose route is missing."""
    record = _stored(record_of(_gen()))
    clear = orjson.loads(record["request"])
    if route is None:
        clear["route"] = None
    else:
        del clear["route"]
    record["request"] = orjson.dumps(clear)
    with pytest.raises(Unreadable, match="malformed"):
        request_of(record, "gen-1")
