"""Property-based fuzzing of the gateway's ASGI app, in-process, in front of a real simulator:
generated methods, paths, headers, keys, ``Last-Event-ID``s and bodies. Whatever arrives, the
gateway never answers 500, every error is an OpenAI-style JSON object, and it keeps serving.
Pass-through paths are fuzzed over a real socket: no spelling reaches the upstream's completion
route or leaves its prefix, however leniently the upstream reads it. Redis-mode records and the
pool's configuration are fuzzed as the pure functions that read them."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import math
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from gateway_helpers import MODEL, fast_sim
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from path_helpers import BODY, COMPLETION_ROUTES, PREFIX, PathStack, lenient, path_stack

from streamsafe import _logging
from streamsafe.engine_sim import Simulator
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.gateway.engines.pool import parse_engine, parse_fallback
from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.generations.store import MemoryEventLog
from streamsafe.gateway.replicas.generation_record import record_of, request_of
from streamsafe.gateway.replicas.record_seal import RecordSeal, Unreadable
from streamsafe.gateway.upstream.kinds import KINDS
from streamsafe.server import ServerThread
from streamsafe.sse import SSEDecoder
from streamsafe_bench.responses_upstream import ResponsesUpstream
from waiting import poll_async

#: The route of a chat completion to vLLM (every request has its route).
CHAT = KINDS["vllm"].route("/v1/chat/completions")

#: Seconds one fuzzed request may take before its client "leaves" (every call is bounded).
_CLIENT_PATIENCE = 2.0
_SIM_MEMORY = 1_000_000


@dataclass
class _Result:
    status: int | None = None
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""
    complete: bool = False
    #: The client left before an answer came (it waited ``_CLIENT_PATIENCE``).
    gave_up: bool = False


class _Harness:
    """A gateway driven through ASGI calls on its own event loop thread."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.run(gw.startup())

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.run(self.gw.shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def request(
        self,
        method: str,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        split: int,
        query: bytes = b"",
    ) -> _Result:
        return self.run(self._request(method, path, headers, body, split, query))  # type: ignore[no-any-return]

    async def _request(
        self,
        method: str,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        split: int,
        query: bytes,
    ) -> _Result:
        result = _Result()
        done = asyncio.Event()
        chunks = [body[:split], body[split:]] if 0 < split < len(body) else [body]
        messages: list[dict[str, Any]] = [
            {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
            for i, c in enumerate(chunks)
        ]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await done.wait()  # the client stays until its answer is complete, or it gives up
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                if result.status is not None:  # as uvicorn refuses it
                    raise RuntimeError("Unexpected ASGI message 'http.response.start'")
                result.status = message["status"]
                result.headers = dict(message.get("headers", []))
            elif message["type"] == "http.response.body":
                assert result.status is not None, "body before start"
                assert not result.complete, "body after the end"
                result.body += message.get("body", b"")
                if not message.get("more_body", False):
                    result.complete = True
                    done.set()

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode("utf-8", "surrogateescape"),
            "query_string": query,
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
        }
        app = asyncio.ensure_future(self.gw(scope, receive, send))
        try:
            try:
                await asyncio.wait_for(asyncio.shield(app), _CLIENT_PATIENCE)
            except TimeoutError:
                result.gave_up = True
                done.set()  # the client leaves; the app must notice and return
                await asyncio.wait_for(app, 10)
        except Exception as exc:  # escaping the app: the server answers a text 500
            if result.status is None:
                return _Result(500, {}, f"{type(exc).__name__}: {exc}".encode(), True)
            raise
        return result


@pytest.fixture(scope="module")
def harness() -> Iterator[_Harness]:
    sim = Simulator(fast_sim(memory_tokens=_SIM_MEMORY, default_max_tokens=4))
    with ServerThread(sim) as sim_server:
        config = GatewayConfig(
            upstream=sim_server.url,
            heartbeat=0.05,
            grace=0.0,
            keep_finished=5.0,
            max_memory_tokens=_SIM_MEMORY // 4,
            max_body_bytes=64 * 1024,
            api_keys=("sk-fuzz",),
        )
        h = _Harness(Gateway(config))
        try:
            yield h
        finally:
            h.close()


# -- strategies ---------------------------------------------------------------------------------

_json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)
_json = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_content = st.one_of(
    st.text(max_size=30),
    st.lists(
        st.one_of(
            st.fixed_dictionaries({"type": st.just("text"), "text": _json}),
            st.dictionaries(st.sampled_from(["type", "text", "image_url"]), _json, max_size=3),
            _json,
        ),
        max_size=3,
    ),
    _json,
)
_message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", ""]), "content": _content}
    ),
    _json,
)
_max_tokens = st.one_of(
    st.integers(min_value=1, max_value=8), st.integers(min_value=-5, max_value=10**12), _json
)
_chat_body = st.fixed_dictionaries(
    {"model": st.one_of(st.just(MODEL), _json), "messages": st.lists(_message, max_size=3)},
    optional={
        "max_tokens": _max_tokens,
        "max_completion_tokens": _max_tokens,
        "stream": st.one_of(st.booleans(), _json),
        "stream_options": st.one_of(st.just({"include_usage": True}), _json),
        "n": st.one_of(st.just(1), _json),
        "temperature": _json,
        "continue_final_message": st.booleans(),
        "metadata": _json,
    },
)
_completion_body = st.fixed_dictionaries(
    {"model": st.one_of(st.just(MODEL), _json)},
    optional={
        "prompt": st.one_of(st.text(max_size=30), st.lists(st.text(max_size=5), max_size=3), _json),
        "max_tokens": _max_tokens,
        "stream": st.one_of(st.booleans(), _json),
    },
)


def _dumps(value: Any) -> bytes:
    """JSON as any client may send it (integers past 64 bits included)."""
    return json.dumps(value).encode()


def _nesting(depth: int) -> bytes:
    return b'{"model":"%s","messages":[{"role":"user","content":"x"}],"metadata":%s}' % (
        MODEL.encode(),
        b"[" * depth + b"]" * depth,
    )


_body = st.one_of(
    _chat_body.map(_dumps),
    _completion_body.map(_dumps),
    _json.map(_dumps),
    st.binary(max_size=200),
    # Depths around every limit a JSON stack has (orjson parses 1024, serialises 254).
    st.sampled_from([1, 64, 127, 128, 129, 253, 254, 255, 300, 1023, 1024, 1025, 3000]).map(
        _nesting
    ),
    st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass")),
)
_COMPLETION_PATHS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/openai/v1/chat/completions",
    "/v1/openai/v1/completions",
]
# Most requests aim at a completion route with POST, where the work is; the rest roam.
_paths = st.one_of(
    st.sampled_from(_COMPLETION_PATHS),
    st.sampled_from(_COMPLETION_PATHS),
    st.sampled_from(_COMPLETION_PATHS),
    st.sampled_from(
        [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/openai/v1/chat/completions",
            "/v1/openai/v1/completions",
            "/v1/models",
            "/v1/openai/v1/models",
            "/health",
            "/ready",
            "/metrics",
            "/stats",
            "/",
            "//v1/chat/completions",
            "/v1/chat/completions/",
        ]
    ),
    st.text(max_size=30).map(lambda t: "/" + t),
)
_methods = st.one_of(
    st.just("POST"),
    st.just("POST"),
    st.just("POST"),
    st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=1, max_size=8),
)
_header_value = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(min_value=-(2**70), max_value=2**70).map(lambda n: str(n).encode()),
)
_headers = st.lists(
    st.tuples(
        st.sampled_from(
            [
                b"authorization",
                b"idempotency-key",
                b"last-event-id",
                b"x-retry-count",
                b"x-stainless-retry-count",
                b"x-llamastack-streaming",
                b"content-length",
                b"content-type",
                b"x-stainless-read-timeout",
                b"accept",
            ]
        ),
        _header_value,
    ),
    max_size=5,
)
_VALID_AUTH = [(b"authorization", b"Bearer sk-fuzz")]
_auth = st.sampled_from([_VALID_AUTH] * 6 + [[], [(b"authorization", b"Bearer nope")]])


def _check(result: _Result) -> None:
    if result.status is None:
        # Nobody is left to answer (a slow non-streaming answer on a loaded machine); the app
        # returned at once, which is what is asked of it.
        assert result.gave_up, "no response at all"
        return
    assert result.status != 500, result.body[:500]
    if result.status >= 400 and result.complete:
        assert result.headers.get(b"content-type", b"").startswith(b"application/json")
        error = orjson.loads(result.body)["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert {"type", "code", "param"} <= set(error)


_SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)


@_SETTINGS
@given(
    method=_methods,
    path=_paths,
    auth=_auth,
    headers=_headers,
    body=_body,
    split=st.integers(min_value=0, max_value=300),
)
def test_any_request_gets_a_json_answer_and_never_a_500(
    harness: _Harness,
    method: str,
    path: str,
    auth: list[tuple[bytes, bytes]],
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    split: int,
) -> None:
    base = [(b"content-type", b"application/json")] if method == "POST" else []
    _check(harness.request(method, path, auth + base + headers, body, split))


@_SETTINGS
@given(
    path=st.sampled_from(_COMPLETION_PATHS),
    headers=_headers.map(lambda hs: [h for h in hs if h[0] != b"authorization"]),
    body=_body,
    split=st.integers(min_value=0, max_value=300),
)
def test_any_completion_body_gets_a_json_answer_and_never_a_500(
    harness: _Harness,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    split: int,
) -> None:
    base = [*_VALID_AUTH, (b"content-type", b"application/json")]
    _check(harness.request("POST", path, base + headers, body, split))


@_SETTINGS
@given(
    body=st.one_of(_chat_body, _completion_body),
    key=st.one_of(st.none(), st.binary(min_size=0, max_size=300), st.sampled_from([b"k1", b"k2"])),
    last_id=st.one_of(
        st.none(),
        st.integers(min_value=-3, max_value=50).map(lambda n: str(n).encode()),
        _header_value,
    ),
    retry=st.one_of(st.none(), st.sampled_from([b"0", b"1", b"2", b"-1", b"x", b"99999999999999"])),
    chat=st.booleans(),
)
def test_keys_resumes_and_retries_never_break_the_gateway(
    harness: _Harness,
    body: dict[str, Any],
    key: bytes | None,
    last_id: bytes | None,
    retry: bytes | None,
    chat: bool,
) -> None:
    headers = [(b"authorization", b"Bearer sk-fuzz"), (b"content-type", b"application/json")]
    if key is not None:
        headers.append((b"idempotency-key", key))
    if last_id is not None:
        headers.append((b"last-event-id", last_id))
    if retry is not None:
        headers.append((b"x-stainless-retry-count", retry))
    path = "/v1/chat/completions" if chat else "/v1/completions"
    _check(harness.request("POST", path, headers, _dumps(body), 0))


def test_the_gateway_still_serves_after_the_fuzzing(harness: _Harness) -> None:
    body = orjson.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "still there?"}],
            "max_tokens": 3,
            "stream": True,
        }
    )
    headers = [(b"authorization", b"Bearer sk-fuzz"), (b"content-type", b"application/json")]
    result = harness.request("POST", "/v1/chat/completions", headers, body, 0)
    assert result.status == 200 and result.complete
    assert result.body.endswith(b"data: [DONE]\n\n")

    async def settled() -> bool:
        # Live generations of clients that left are aborted (grace 0).
        return bool(
            await poll_async(lambda: harness.gw.registry.live_generations == 0, 10, every=0.01)
        )

    assert harness.run(settled())


# -- Responses ids -------------------------------------------------------------------------------

_TENANTS = {"mine": b"sk-fuzz", "theirs": b"sk-other"}


@dataclass
class _ResponsesHarness:
    harness: _Harness
    #: The response id of a finished stream of each tenant (kept).
    ids: dict[str, str]


@pytest.fixture(scope="module")
def responses() -> Iterator[_ResponsesHarness]:
    with ServerThread(ResponsesUpstream()) as upstream:
        config = GatewayConfig(
            upstream=upstream.url,
            upstream_kind="ogx",
            api_keys=tuple(k.decode() for k in _TENANTS.values()),
        )
        h = _Harness(Gateway(config))
        try:
            ids = {}
            for name, key in _TENANTS.items():
                body = orjson.dumps({"model": MODEL, "input": "fuzz", "stream": True})
                auth = [
                    (b"authorization", b"Bearer " + key),
                    (b"content-type", b"application/json"),
                ]
                result = h.request("POST", "/v1/responses", auth, body, 0)
                assert result.status == 200 and result.complete, result.body[:300]
                first = SSEDecoder().feed(result.body)[0]
                ids[name] = orjson.loads(first.data)["response"]["id"]
            yield _ResponsesHarness(h, ids)
        finally:
            h.close()


_odd_ids = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="%/?#.;~\\\x00\r\n ", max_size=12),
    st.sampled_from(["resp_" + "x" * 10_000, "r" * 200_000, "..", "%2e%2e", "resp_%00"]),
)
_starting_after = st.one_of(
    st.none(),
    st.integers(min_value=-3, max_value=40).map(str),
    st.sampled_from(["", "x", "1.5", "-1", str(2**70), "9" * 5000]),
)


@_SETTINGS
@given(
    asked=st.one_of(
        st.sampled_from(["mine", "theirs"]).map(lambda w: (w, "")), _odd_ids.map(lambda i: ("", i))
    ),
    suffix=st.sampled_from(["", "", "x", "/", "/cancel"]),
    cancel=st.booleans(),
    stream=st.sampled_from([b"stream=true", b"stream=true", b"stream=1", b"stream=false", b""]),
    after=_starting_after,
    who=st.sampled_from(["mine", "mine", "theirs", None]),
)
def test_any_responses_id_gets_a_clear_json_answer_and_no_other_tenant_s_stream(
    responses: _ResponsesHarness,
    asked: tuple[str, str],
    suffix: str,
    cancel: bool,
    stream: bytes,
    after: str | None,
    who: str | None,
) -> None:
    owner, odd = asked
    response_id = (responses.ids[owner] if owner else odd) + suffix
    headers = [] if who is None else [(b"authorization", b"Bearer " + _TENANTS[who])]
    query = stream + (b"" if after is None else b"&starting_after=" + after.encode())
    if cancel:
        result = responses.harness.request(
            "POST", f"/v1/responses/{response_id}/cancel", headers, b"", 0
        )
    else:
        result = responses.harness.request(
            "GET", f"/v1/responses/{response_id}", headers, b"", 0, query
        )
    _check(result)
    assert result.status is not None and result.complete
    if result.status == 200:
        # Served from the gateway's log: a stream of the caller's own, never another's.
        assert owner and owner == who and not suffix and not cancel, (result.body[:200], who)
    else:
        assert result.status in (400, 401, 403), result.body[:300]  # no pass-through with keys


def test_the_responses_fuzzing_left_every_stream_as_it_was(responses: _ResponsesHarness) -> None:
    held = responses.harness.gw.registry.generations
    states = sorted(g.state.value for g in held)
    assert states == ["done", "done"]  # nobody cancelled or ended either stream


# -- pass-through paths, over a real socket -------------------------------------------------------

_SEGMENTS = [
    "v1", "chat", "completions", "models", "files", "metrics", "x", "", ".", "..", "%2e",
    "%2E%2e", "%2e.", ".%2E", "..;", ";x", "%2f", "%2F..", "..%2f", "\\", "%5c", "..%5C",
    "%63ompletions", "chat%2Fcompletions", "%00", "%0d%0a", "%252e%252e", "~", "%", "%zz",
]  # fmt: skip
_pass_paths = st.lists(st.sampled_from(_SEGMENTS), min_size=1, max_size=7).map(
    lambda segments: ("/" + "/".join(segments)).encode()
)


@pytest.fixture(scope="module")
def paths() -> Iterator[PathStack]:
    with path_stack() as stack:
        yield stack


@_SETTINGS
@given(method=st.sampled_from([b"GET", b"POST", b"DELETE"]), target=_pass_paths)
def test_no_path_spelling_reaches_a_completion_route_or_leaves_the_prefix(
    paths: PathStack, method: bytes, target: bytes
) -> None:
    seen = len(paths.recorder.seen)
    started = paths.gw.stats()["generations_started"]
    status, body = paths.send(method, target, BODY if method == b"POST" else b"")
    assert status != 500, body
    new = paths.recorder.seen[seen:]
    served = 0
    for raw, headers in new:
        where = lenient(raw)
        assert where.startswith(PREFIX + "/") or where == PREFIX, (target, raw)
        route = where[len(PREFIX) :].rstrip("/")
        if route in COMPLETION_ROUTES:
            assert b"x-path-probe" not in headers, (target, raw)  # never passed through
            served += 1
    assert paths.gw.stats()["generations_started"] == started + served


# -- Redis-mode records and the pool's configuration (pure) ---------------------------------------

_SEAL = RecordSeal("fuzz-secret")
_RECORD_FIELDS = ["route", "tenant", "path", "body", "fingerprint", "cost", "stream", "key"]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    body=st.binary(max_size=200),
    forward=st.binary(max_size=100),
    tenant=st.text(max_size=20),
    cost=st.integers(min_value=0, max_value=2**40),
    sealed=st.booleans(),
)
def test_a_generation_s_redis_record_reads_back_as_its_request(
    body: bytes, forward: bytes, tenant: str, cost: int, sealed: bool
) -> None:
    req = GenerationRequest(
        tenant, "/v1/chat/completions", body, b"f" * 16, cost, True, forward=forward, route=CHAT
    )
    seal = _SEAL if sealed else None
    record = record_of(Generation("gen-1", req, MemoryEventLog(), None, 0.0), seal)
    stored = {k: v if isinstance(v, bytes) else str(v).encode() for k, v in record.items()}
    back = request_of(stored, "gen-1", seal)
    assert (back.body, back.tenant, back.cost) == (body, tenant, cost)
    assert back.forward == (forward if sealed else b"")
    assert back.withheld == (bool(forward) and not sealed)
    if sealed and len(body) > 8:
        assert body not in b"".join(stored.values())


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    record=st.dictionaries(
        st.sampled_from([*_RECORD_FIELDS, "forward", "withheld"]),
        st.one_of(
            st.binary(max_size=40),
            st.just(b"\x00ss1" + b"x" * 30),  # a sealed value that does not open
            st.sampled_from([b"1", b"-3", b"[]", b'["/p","/p","openai-chat",true,true,""]']),
        ),
    ),
    sealed=st.booleans(),
)
def test_any_redis_record_is_read_or_refused_as_unreadable(
    record: dict[str, bytes], sealed: bool
) -> None:
    # A mirror reading a record it cannot read logs it and does not follow the generation; any
    # other exception would have been a 500 for the request that wanted to attach to it.
    with contextlib.suppress(Unreadable):
        request_of(record, "gen-1", _SEAL if sealed else None)


_spec_text = st.text(
    alphabet=st.sampled_from(list("hps:/.,= 0123456789-abcmodelswightnfry")), max_size=60
) | st.sampled_from(["http://a weight=nan", "http://a memory=-1", "http://a models=", "a=a"])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(text=_spec_text)
def test_any_engine_or_fallback_spec_is_parsed_or_refused_with_a_value_error(text: str) -> None:
    for parse in (parse_engine, parse_fallback):
        try:
            parse(text)
        except ValueError as exc:
            assert str(exc)
    try:
        GatewayConfig(upstream="http://a", engines=(text, "http://b"))
    except ValueError as exc:
        assert str(exc)


# -- what reaches the text log, and what configures the gateway ----------------------------------

#: Characters a caller may send to forge a text log line or drive a terminal.
_FORGING = st.sampled_from(list('\n\r\t\x00\x1b\x7f\x85\x9b\u2028\u2029 ="\\'))
_forged_text = st.lists(st.one_of(_FORGING, st.characters()), max_size=30).map("".join)
_UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_RECORD_START = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z [A-Z]+ [a-z_.]+ ")


@pytest.fixture(scope="module")
def text_log() -> Iterator[io.StringIO]:
    """What the gateway's loggers write in the text format, at INFO."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(_logging.TextFormatter())
    logger = logging.getLogger("streamsafe")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@_SETTINGS
@given(
    method=_methods,
    path=_forged_text.map(lambda t: "/v1/" + t),
    name=st.sampled_from([b"x-request-id", b"idempotency-key", b"authorization", b"user-agent"]),
    value=_forged_text.map(lambda t: t.encode("utf-8", "surrogatepass")),
)
def test_no_path_or_header_forges_a_text_log_line(
    harness: _Harness,
    text_log: io.StringIO,
    method: str,
    path: str,
    name: bytes,
    value: bytes,
) -> None:
    text_log.seek(0)
    text_log.truncate()
    _check(harness.request(method, path, [(name, value)], b"", 0))
    written = text_log.getvalue()
    assert " streamsafe.access " in written  # its access line, at least
    assert not _UNSAFE.search(written), written
    for line in written.splitlines():
        assert _RECORD_START.match(line) or line.startswith("  "), line


_password = st.text(st.characters(blacklist_characters="/?#@\x00"), min_size=1, max_size=20)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    password=_password,
    user=st.text(st.characters(blacklist_characters="/?#@:"), max_size=10),
    host=st.sampled_from(["h", "10.0.0.5:8000", "[::1]:8000", "h:8000/v1", "h?x=1"]),
    options=st.sampled_from(["", " models=a", " weight=2", " bogus", " weight=nan"]),
)
def test_no_engine_name_or_error_shows_an_upstream_password(
    password: str, user: str, host: str, options: str
) -> None:
    marked = "\x00" + password  # nothing else in the spec can hold it by chance
    text = f"http://{user}:{marked}@{host}{options}"
    try:
        spec = parse_engine(text)
    except ValueError as exc:
        assert marked not in str(exc)
        return
    assert marked not in spec.url + str(spec) + repr(spec)
    assert spec.userinfo == f"{user}:{marked}"


_option_names = st.sampled_from(
    [
        "port",
        "grace",
        "idle-timeout",
        "max-kept-mb",
        "max-inflight",
        "lease",
        "commit",
        "json-keepalive",
        "upstream",
        "upstream-api-key",
        "redis-secret",
        "api-key",
        "admin-key",
        "tenant-weight",
    ]
)
_SECRET_OPTIONS = {"upstream", "upstream-api-key", "redis-secret", "api-key", "admin-key"}
_toml_values = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1", "2.5", "true", "[]", "{}"]),
    st.integers(min_value=-(2**40), max_value=2**40).map(str),
    st.floats().map(repr),  # nan and inf are TOML's own spellings
    st.sampled_from(["'SECRET-VALUE'", "['SECRET-VALUE']", "{ k = 'SECRET-VALUE' }", "'early'"]),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    pairs=st.lists(st.tuples(_option_names, _toml_values), max_size=4),
    junk=st.binary(max_size=8),
)
def test_any_config_file_is_read_or_refused_in_one_line_without_its_secrets(
    tmp_path_factory: pytest.TempPathFactory, pairs: list[tuple[str, str]], junk: bytes
) -> None:
    from streamsafe._config_file import ConfigError, apply
    from streamsafe.cli import _subcommand, build_parser

    text = "".join(f"{name} = {value}\n" for name, value in dict(pairs).items()).encode() + junk
    path = tmp_path_factory.mktemp("cfg") / "gateway.toml"
    path.write_bytes(text)
    parser = build_parser("serve")
    argv = ["serve", "--config", str(path)]
    try:
        args = apply(parser, _subcommand(parser, "serve"), argv, parser.parse_args(argv), str(path))
    except ConfigError as exc:
        said = str(exc)
        key = said.removeprefix(f"{path}: ").partition(":")[0]
        assert "\n" not in said
        # A string option may hold a secret: its value is never shown (a number's may be).
        assert key not in _SECRET_OPTIONS or "SECRET-VALUE" not in said, said
        return
    for name in ("grace", "idle_timeout", "max_kept_mb", "lease"):
        assert math.isfinite(getattr(args, name)), name  # nan and inf never get through
