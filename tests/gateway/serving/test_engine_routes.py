"""Every vLLM route through the gateway (issue 31, item 1), against the simulator: routed by
``model`` across the pool, the tenant's key checked, admitted by what the route costs, a
multipart form streamed, operator routes closed to tenants; and the route table is the one the
docs show."""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Iterator

import httpx2
import orjson
import pytest
from gateway_helpers import MODEL, fast_sim, make_stack, wait_for
from hypothesis import given
from hypothesis import strategies as st

from server_stops import stop_later
from streamsafe.engine_sim import Simulator
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.gateway.serving.engine_calls import form_model
from streamsafe.gateway.upstream.kinds import KINDS
from streamsafe.gateway.upstream.routes import (
    ROUTES,
    Handling,
    find_route,
    markdown_table,
    route_label,
)
from streamsafe.server import ServerThread
from streamsafe.tokens import estimate_input_tokens, estimate_text_tokens

pytestmark = pytest.mark.timeout(60)

DOCS = pathlib.Path(__file__).resolve().parents[3] / "docs" / "gateway.md"
EMBED = {"model": MODEL, "input": ["the quick brown fox", "jumps"]}


def _keys(body: bytes) -> set[str]:
    doc = orjson.loads(body)
    return set(doc) if isinstance(doc, dict) else set()


def test_each_route_answers_through_the_gateway_as_the_engine_answers_straight() -> None:
    with make_stack() as stack, httpx2.Client(timeout=10) as client:
        for method, path, body in (
            ("POST", "/v1/embeddings", EMBED),
            ("POST", "/v1/embeddings", {"model": "no-such-model", "input": "x"}),
            ("POST", "/v1/embeddings", {"model": MODEL, "input": [1.5]}),
            ("POST", "/tokenize", {"model": MODEL, "prompt": "hello there"}),
            ("GET", "/version", None),
            ("POST", "/v1/rerank", {"model": MODEL, "query": "q", "documents": ["d"]}),
        ):
            straight = client.request(method, stack.sim_url + path, json=body)
            through = client.request(method, stack.url + path, json=body)
            assert through.status_code == straight.status_code, (path, through.text)
            assert _keys(through.content) == _keys(straight.content), path
        embedded = client.post(stack.url + "/v1/embeddings", json=EMBED).json()
        assert [d["index"] for d in embedded["data"]] == [0, 1]
        # Straight and through once each: the same call again was answered from the first.
        assert stack.sim.stats()["embeddings"] == 2


def test_retries_of_one_embedding_call_coalesce_into_one_engine_call() -> None:
    with make_stack(collapse_identical="off") as stack, httpx2.Client(timeout=10) as client:
        key = {"idempotency-key": "embed-1"}
        first = client.post(stack.url + "/v1/embeddings", json=EMBED, headers=key)
        again = client.post(stack.url + "/v1/embeddings", json=EMBED, headers=key)
        assert first.status_code == again.status_code == 200
        assert again.content == first.content
        assert stack.sim.stats()["embeddings"] == 1
        other = {**EMBED, "input": "another text"}
        r = client.post(stack.url + "/v1/embeddings", json=other, headers=key)
        assert r.status_code == 422  # the key was used with another body
        r = client.post(stack.url + "/v1/embeddings", json=EMBED)  # no key: its own call
        assert r.status_code == 200 and stack.sim.stats()["embeddings"] == 2
        stats = client.get(stack.url + "/stats").json()
        assert stats["replayed"] == 1


def test_a_request_goes_to_an_engine_of_the_model_it_names() -> None:
    sims = [Simulator(fast_sim(model=name)) for name in ("model-a", "model-b")]
    servers = [ServerThread(sim).start() for sim in sims]
    engines = (f"{servers[0].url} models=model-a", f"{servers[1].url} models=model-b")
    gw = Gateway(GatewayConfig(upstream=servers[0].url, engines=engines))
    gw_server = ServerThread(gw).start()
    try:
        with httpx2.Client(timeout=10) as client:
            for i, name in enumerate(("model-b", "model-a", "model-b")):
                body = {"model": name, "input": f"text {i}"}
                r = client.post(gw_server.url + "/v1/embeddings", json=body)
                assert r.status_code == 200, r.text
                assert r.json()["model"] == name
            assert [sim.stats()["embeddings"] for sim in sims] == [1, 2]
            r = client.post(gw_server.url + "/v1/embeddings", json={"model": "zz", "input": "x"})
            assert r.status_code == 404
            assert "no engine serves model 'zz'" in r.json()["error"]["message"]
            # A form passed through (not served) is routed by its model field too.
            start, end = _form("model-b", b"RIFF")
            form = {"content-type": "multipart/form-data; boundary=b0undary"}
            r = client.post(
                gw_server.url + "/v1/audio/transcriptions", content=start + end, headers=form
            )
            assert r.status_code == 200
            assert [sim.stats()["form_bytes_received"] for sim in sims] == [0, len(start + end)]
            # A route that takes no model goes to a live engine.
            assert client.get(gw_server.url + "/version").json() == {"version": "streamsafe-sim"}
    finally:
        stop_later(gw_server, *servers)


def test_unknown_routes_and_methods_and_bad_messages_are_refused_with_json() -> None:
    with make_stack() as stack, httpx2.Client(timeout=10) as client:
        r = client.post(stack.url + "/v1/no-such-route", json={})
        assert r.status_code == 404 and "no route" in r.json()["error"]["message"]
        r = client.get(stack.url + "/v1/embeddings")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        # A Messages request without its messages: Anthropic's error shape, naming the field.
        r = client.post(stack.url + "/v1/messages", json={"model": MODEL})
        assert r.status_code == 400 and r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_operator_routes_need_the_admin_key_and_are_closed_without_one() -> None:
    keys = {"api_keys": ("tenant-key",), "admin_key": "admin"}
    with make_stack(**keys) as stack, httpx2.Client(timeout=10) as client:
        for key in (None, "tenant-key", "wrong"):
            headers = {"authorization": f"Bearer {key}"} if key else {}
            r = client.get(stack.url + "/is_sleeping", headers=headers)
            assert r.status_code == 403, (key, r.text)
            assert r.json()["error"]["type"] == "permission_error"
            r = client.post(stack.url + "/reset_prefix_cache", headers=headers)
            assert r.status_code == 403
        r = client.get(stack.url + "/is_sleeping", headers={"authorization": "Bearer admin"})
        assert r.status_code == 200 and r.json() == {"is_sleeping": False}
    with make_stack() as stack, httpx2.Client(timeout=10) as client:  # no admin key: closed
        r = client.get(stack.url + "/is_sleeping")
        assert r.status_code == 403 and "no admin key" in r.json()["error"]["message"]


def test_operator_routes_are_closed_behind_a_pass_through_kind_too() -> None:
    with make_stack(upstream_kind="openai") as stack, httpx2.Client(timeout=10) as client:
        assert client.get(stack.url + "/is_sleeping").status_code == 403
        assert client.get(stack.url + "/version").status_code == 200  # passed through


def test_tenants_need_their_key_and_stored_state_stays_theirs() -> None:
    with make_stack(api_keys=("key-a",)) as stack, httpx2.Client(timeout=10) as client:
        assert client.post(stack.url + "/v1/embeddings", json=EMBED).status_code == 401
        auth = {"authorization": "Bearer key-a"}
        r = client.post(stack.url + "/v1/embeddings", json=EMBED, headers=auth)
        assert r.status_code == 200
        # Stored responses are shared upstream under the gateway's one identity.
        r = client.get(stack.url + "/v1/responses/resp-1", headers=auth)
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        body = {"model": MODEL, "input": "hi", "previous_response_id": "resp-1"}
        r = client.post(stack.url + "/v1/responses", json=body, headers=auth)
        assert r.status_code == 403
    with make_stack(api_keys=("key-a",), tenant_passthrough="shared") as stack:
        r = httpx2.get(stack.url + "/v1/responses/resp-1", headers=auth, timeout=10)
        assert r.status_code == 404  # the engine's own answer: the simulator stores none


def test_admission_counts_what_an_embedding_costs() -> None:
    with make_stack(max_memory_tokens=64) as stack, httpx2.Client(timeout=10) as client:
        small = {"model": MODEL, "input": "x" * 200}  # 50 tokens
        assert client.post(stack.url + "/v1/embeddings", json=small).status_code == 200
        large = {"model": MODEL, "input": ["x" * 200, "y" * 200]}  # 100 tokens
        r = client.post(stack.url + "/v1/embeddings", json=large)
        assert r.status_code == 400
        assert "about 100 tokens of engine memory" in r.json()["error"]["message"]
        assert stack.sim.stats()["embeddings"] == 1
        assert stack.gw.admission.memory == 0  # the place was given back


def _form(model: str, file: bytes, boundary: str = "b0undary") -> tuple[bytes, bytes]:
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{model}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()
    return head + file, f"\r\n--{boundary}--\r\n".encode()


def test_an_audio_form_is_routed_by_its_model_and_streamed_not_buffered() -> None:
    with make_stack() as stack, httpx2.Client(timeout=10) as client:
        start, end = _form(MODEL, b"RIFF" + b"\0" * 70_000)
        sent_rest = threading.Event()

        def body() -> Iterator[bytes]:
            yield start
            # The engine holds the form's start before its end is sent: the gateway streamed it
            # (buffered whole, this wait never ends).
            wait_for(lambda: stack.sim.stats()["form_bytes_received"] > 0, what="form's start")
            sent_rest.set()
            yield b"\0" * 50_000 + end

        r = client.post(
            stack.url + "/v1/audio/transcriptions",
            content=body(),
            headers={"content-type": "multipart/form-data; boundary=b0undary"},
        )
        assert sent_rest.is_set()
        total = len(start) + 50_000 + len(end)
        assert r.status_code == 200 and r.json() == {"text": f"{total} bytes of form"}
        assert stack.sim.stats()["form_bytes_received"] == total


@given(
    model=st.text(
        st.characters(min_codepoint=33, max_codepoint=0x10FFFF, exclude_categories=("Cs",)),
        min_size=1,
        max_size=60,
    ),
    file=st.binary(max_size=200),
)
def test_a_form_s_model_is_read_from_its_start_whatever_follows(model: str, file: bytes) -> None:
    start, end = _form(model, file)
    assert form_model(start + end) == model
    assert form_model(start[: start.index(b"\r\n--", 10)]) is None  # not whole yet


@given(st.lists(st.text(max_size=40), max_size=6), st.lists(st.integers(0, 99), max_size=6))
def test_input_tokens_count_every_text_and_token_id(texts: list[str], ids: list[int]) -> None:
    body = {"model": "m" * 50, "input": texts, "extra": {"ids": ids}}
    expected = sum(estimate_text_tokens(t) for t in texts) + len(ids)
    assert estimate_input_tokens(body) == expected


def test_the_route_table_is_one_and_the_docs_show_it() -> None:
    assert markdown_table() in DOCS.read_text()
    served = {r.path for r in ROUTES if r.handling is Handling.SERVED}
    assert served == set(KINDS["vllm"].routes)
    assert len({r.path for r in ROUTES}) == len(ROUTES)
    assert find_route("/v1/responses/resp-1").path == "/v1/responses/{id}"  # type: ignore[union-attr]
    assert route_label("/v1/responses/resp-1/cancel") == "/v1/responses/{id}/cancel"
    assert route_label("/v1/responses/a/b") == route_label("/whatever") == "other"
