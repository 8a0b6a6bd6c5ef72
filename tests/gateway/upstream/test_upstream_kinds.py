"""The upstream-kind table and its pure functions (the facts behind them are pinned against the
real servers in tests/llamastack)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsafe.gateway.upstream.answer_end import ends_answer
from streamsafe.gateway.upstream.error_events import ErrorEvent, parse_error_event
from streamsafe.gateway.upstream.kinds import KINDS, describe_kind
from streamsafe.gateway.upstream.probe import (
    KIND_NAMES,
    ProbeResult,
    describe_probes,
    detect_kind,
    next_probe,
)
from streamsafe.gateway.upstream.wire import Wire

LS = KINDS["llama-stack"]
VLLM = KINDS["vllm"]
OPENAI = KINDS["openai"]


def test_every_kind_is_in_the_table_under_its_name() -> None:
    assert set(KIND_NAMES) == set(KINDS)
    for name, kind in KINDS.items():
        assert kind.name == name
        for path, route in kind.routes.items():
            assert route.path == path and kind.route(path) is route


def test_llama_stack_routes_keep_their_paths_and_never_end_with_done() -> None:
    assert set(LS.routes) == {
        "/v1/inference/chat-completion",
        "/v1/inference/completion",
        "/v1/openai/v1/chat/completions",
        "/v1/openai/v1/completions",
    }
    for route in LS.routes.values():
        assert route.upstream_path == route.path
        assert not route.upstream_done and not route.client_done
    assert LS.route("/v1/inference/chat-completion").wire is Wire.LLAMA_STACK_CHAT  # type: ignore[union-attr]
    assert LS.passthrough and LS.masks_errors and not LS.can_continue
    assert LS.health_path == "/v1/health" and not LS.health_covers_engine


def test_vllm_serves_llama_stack_aliases_without_done() -> None:
    alias = VLLM.route("/v1/openai/v1/chat/completions")
    assert alias is not None and alias.upstream_path == "/v1/chat/completions"
    assert alias.upstream_done and not alias.client_done
    assert VLLM.route("/v1/inference/chat-completion") is None
    assert VLLM.can_continue and VLLM.health_covers_engine and VLLM.health_path == "/health"
    assert not OPENAI.can_continue and OPENAI.route("/v1/openai/v1/chat/completions") is None


@pytest.mark.parametrize(
    ("wire", "payload", "ends"),
    [
        (Wire.OPENAI_CHAT, b'{"choices":[{"delta":{"content":"a"},"finish_reason":null}]}', False),
        (Wire.OPENAI_CHAT, b'{"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}', True),
        (Wire.OPENAI_CHAT, b'{"choices": [{"finish_reason": "length"}]}', True),
        (Wire.OPENAI_COMPLETION, b'{"choices":[{"text":"a","finish_reason":"length"}]}', True),
        (Wire.LLAMA_STACK_CHAT, b'{"event":{"event_type":"progress","stop_reason":null}}', False),
        (Wire.LLAMA_STACK_CHAT, b'{"event":{"event_type":"complete","stop_reason":null}}', True),
        (Wire.LLAMA_STACK_COMPLETION, b'{"delta":"a","stop_reason":null}', False),
        (Wire.LLAMA_STACK_COMPLETION, b'{"delta":"","stop_reason":"out_of_tokens"}', True),
        (Wire.OPENAI_CHAT, b"[DONE]", False),
    ],
)
def test_ends_answer_knows_each_wire(wire: Wire, payload: bytes, ends: bool) -> None:
    assert ends_answer(wire, payload) is ends


@given(st.text(min_size=1, max_size=20), st.sampled_from([None, "stop", "length", "tool_calls"]))
def test_an_openai_chunk_ends_the_answer_iff_it_has_a_finish_reason(
    content: str, reason: str | None
) -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": reason}]}
    assert ends_answer(Wire.OPENAI_CHAT, orjson.dumps(chunk)) is (reason is not None)


def test_llama_stack_masked_errors_are_upstream_failures() -> None:
    masked = b'{"error": {"message": "500: Internal server error: An unexpected error occurred."}}'
    error = parse_error_event(LS, masked)
    assert error is not None and error.status == 500 and error.upstream_failure
    timed_out = parse_error_event(LS, b'{"error": {"message": "504: Operation timed out: "}}')
    assert timed_out is not None and timed_out.status == 504 and timed_out.upstream_failure
    bad = parse_error_event(LS, b'{"error": {"message": "400: Invalid value: Model x not found"}}')
    assert bad is not None and bad.status == 400 and not bad.upstream_failure


def test_vllm_error_events_carry_their_code() -> None:
    event = b'{"error":{"message":"EngineDeadError","type":"internal_error","code":500}}'
    error = parse_error_event(VLLM, event)
    assert error is not None and error.status == 500 and error.message == "EngineDeadError"
    shed = parse_error_event(VLLM, b'{"error":{"message":"full","code":"429"}}')
    assert shed is not None and shed.status == 429 and not shed.upstream_failure
    # Only Llama Stack puts the status in the message.
    plain = parse_error_event(VLLM, b'{"error":{"message":"400: not a prefix here"}}')
    assert plain is not None and plain.status == 500


def test_payloads_that_are_not_errors_are_not_parsed() -> None:
    assert parse_error_event(LS, b'{"event":{"event_type":"progress"}}') is None
    assert parse_error_event(VLLM, b"[DONE]") is None
    assert parse_error_event(VLLM, b'{"error": null}') is None
    broken = parse_error_event(VLLM, b'{"error": {"message": "cut')
    assert broken is not None and broken.upstream_failure


@given(st.binary(max_size=200))
def test_parse_error_event_never_raises(tail: bytes) -> None:
    for kind in KINDS.values():
        error = parse_error_event(kind, b'{"error"' + tail)
        assert error is None or 400 <= error.status <= 599


_OK = ProbeResult(200, b'{"status":"OK"}')


@pytest.mark.parametrize(
    ("probes", "kind"),
    [
        # Llama Stack's health alone settles nothing: which release is it?
        ({"/v1/health": _OK}, None),
        ({"/v1/health": _OK, "/v1/chat/completions": ProbeResult(200)}, "ogx"),
        (
            {
                "/v1/health": _OK,
                "/v1/chat/completions": ProbeResult(404),
                "/v1/inference/chat-completion": ProbeResult(405),
            },
            "llama-stack",
        ),
        # With auth on, a route that asks for a key is still served.
        ({"/v1/health": _OK, "/v1/chat/completions": ProbeResult(401)}, "ogx"),
        # A Llama Stack serving neither (no inference API): no kind protects anything there.
        (
            {
                "/v1/health": _OK,
                "/v1/chat/completions": ProbeResult(404),
                "/v1/inference/chat-completion": ProbeResult(404),
            },
            None,
        ),
        ({"/v1/health": ProbeResult(404), "/health": ProbeResult(200)}, "vllm"),
        ({"/v1/health": ProbeResult(404), "/health": ProbeResult(503)}, "vllm"),
        (
            {"/v1/health": ProbeResult(404), "/health": ProbeResult(404), "/v1/models": (200,)},
            "openai",
        ),
        (
            {"/v1/health": ProbeResult(200, b"ok"), "/health": ProbeResult(200)},
            "vllm",
        ),
        ({"/v1/health": ProbeResult(None), "/health": ProbeResult(None)}, None),
        ({"/v1/models": ProbeResult(401)}, "openai"),
        ({"/v1/models": ProbeResult(500)}, None),
    ],
)
def test_detect_kind(probes: dict[str, object], kind: str | None) -> None:
    fixed = {p: r if isinstance(r, ProbeResult) else ProbeResult(*r) for p, r in probes.items()}  # type: ignore[arg-type]
    assert detect_kind(fixed) == kind


#: What each server answered each probe path (GET), measured: OGX 1.5.0, llama-stack 0.7.3 and
#: 0.2.12 (each in front of the simulator), and the simulator (vLLM's surface).
_MEASURED: dict[str, dict[str, tuple[int, bytes]]] = {
    "ogx": {
        "/v1/health": (200, b'{"status":"OK"}'),
        "/v1/version": (200, b'{"version":"1.5.0"}'),
        "/v1/chat/completions": (200, b'{"data":[],"has_more":false,"object":"list"}'),
        "/v1/inference/chat-completion": (404, b'{"detail":"Not Found"}'),
        "/health": (404, b'{"detail":"Not Found"}'),
        "/v1/models": (200, b'{"object":"list","data":[{"id":"vllm/sim-llama-8b"}]}'),
    },
    "llama-stack-0.7": {
        "/v1/health": (200, b'{"status":"OK"}'),
        "/v1/version": (200, b'{"version":"0.7.3"}'),
        "/v1/chat/completions": (200, b'{"data":[],"has_more":false,"object":"list"}'),
        "/v1/inference/chat-completion": (404, b'{"detail":"Not Found"}'),
        "/health": (404, b'{"detail":"Not Found"}'),
        "/v1/models": (200, b'{"data":[{"id":"vllm/sim-llama-8b"}]}'),
    },
    "llama-stack-0.2": {
        "/v1/health": (200, b'{"status":"OK"}'),
        "/v1/version": (200, b'{"version":"0.2.12"}'),
        "/v1/chat/completions": (404, b'{"detail":"Not Found"}'),
        "/v1/inference/chat-completion": (405, b'{"detail":"Method Not Allowed"}'),
        "/health": (404, b'{"detail":"Not Found"}'),
        "/v1/models": (200, b'{"data":[{"identifier":"sim-llama-8b"}]}'),
    },
    "simulator": {
        "/v1/health": (404, b""),
        "/v1/version": (404, b""),
        "/v1/chat/completions": (405, b""),
        "/v1/inference/chat-completion": (404, b""),
        "/health": (200, b""),
        "/v1/models": (200, b'{"object":"list","data":[{"id":"sim-llama-8b"}]}'),
    },
}


@pytest.mark.parametrize(
    ("server", "kind", "asked", "described"),
    [
        (
            "ogx",
            "ogx",
            ["/v1/health", "/v1/version", "/v1/chat/completions", "/v1/models"],
            "/v1/version 200 (version 1.5.0)",
        ),
        (
            "llama-stack-0.7",
            "ogx",
            ["/v1/health", "/v1/version", "/v1/chat/completions", "/v1/models"],
            "models vllm/sim-llama-8b",
        ),
        (
            "llama-stack-0.2",
            "llama-stack",
            [
                "/v1/health",
                "/v1/version",
                "/v1/chat/completions",
                "/v1/inference/chat-completion",
                "/v1/models",
            ],
            "/v1/inference/chat-completion 405",
        ),
        ("simulator", "vllm", ["/v1/health", "/health", "/v1/models"], "models sim-llama-8b"),
    ],
)
def test_the_probe_asks_what_tells_each_server_apart(
    server: str, kind: str, asked: list[str], described: str
) -> None:
    answers = _MEASURED[server]
    probes: dict[str, ProbeResult] = {}
    while (path := next_probe(probes)) is not None:
        probes[path] = ProbeResult(*answers[path])
    assert list(probes) == asked
    assert detect_kind(probes) == kind
    assert described in describe_probes(probes)


def test_ogx_serves_its_openai_routes_without_done_and_passes_the_rest() -> None:
    ogx = KINDS["ogx"]
    assert set(ogx.routes) == {"/v1/chat/completions", "/v1/completions", "/v1/responses"}
    assert ogx.route("/v1/responses").wire is Wire.OPENAI_RESPONSES  # type: ignore[union-attr]
    for route in ogx.routes.values():
        assert route.upstream_path == route.path
        # Relayed as OGX ends them, no [DONE]; a failure after commit is its own error event.
        assert not route.upstream_done and not route.client_done and not route.reset_on_failure
    assert ogx.passthrough and not ogx.can_continue and not ogx.health_covers_engine
    assert ogx.health_path == "/v1/health"
    assert "POST /v1/chat/completions, /v1/completions, /v1/responses" in describe_kind(ogx)


def test_ogx_error_events_carry_their_status_as_a_string_code() -> None:
    payload = b'{"error":{"message":"Service Unavailable","code":"503"}}'
    assert parse_error_event(KINDS["ogx"], payload) == ErrorEvent(503, "Service Unavailable")


@pytest.mark.parametrize(
    ("payload", "ends"),
    [
        (b'{"response":{"status":"completed"},"type":"response.completed"}', True),
        (b'{"response":{},"sequence_number":22,"type":"response.incomplete"}', True),
        (b'{"response": {}, "type": "response.failed"}', True),
        (b'{"delta":"x","sequence_number":4,"type":"response.output_text.delta"}', False),
        (b'{"item":{"type":"message"},"type":"response.output_item.done"}', False),
        (b'{"response":{},"type":"response.in_progress"}', False),
    ],
)
def test_a_responses_stream_ends_on_its_terminal_event(payload: bytes, ends: bool) -> None:
    assert ends_answer(Wire.OPENAI_RESPONSES, payload) is ends
