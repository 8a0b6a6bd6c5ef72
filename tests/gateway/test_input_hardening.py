"""Hostile and careless input gets a clear JSON error naming what is wrong, never a 500 with a
text body; the admin routes are guarded; a bug in a handler is a JSON 500 with a request id."""

from __future__ import annotations

import logging
from typing import Any

import httpx2
import orjson
import pytest
from gateway_helpers import MODEL, Stack, chat_body, make_stack, post_stream

from streamsafe.gateway import Gateway


def _post(url: str, body: Any, headers: dict[str, Any] | None = None) -> httpx2.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    hdrs = {"content-type": "application/json", **(headers or {})}
    return httpx2.post(url + "/v1/chat/completions", content=content, headers=hdrs, timeout=10)


def _error(resp: httpx2.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    error: dict[str, Any] = resp.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["message"]
    return error


# -- row 1: a content part whose text is not a string -----------------------------------------


@pytest.mark.parametrize("text", [5, None, ["a"], {"t": 1}, True])
def test_a_content_part_with_a_non_string_text_is_400_naming_the_field(
    stack: Stack, text: Any
) -> None:
    body = chat_body()
    body["messages"] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "ok"}, {"type": "text", "text": text}],
        }
    ]
    error = _error(_post(stack.url, body), 400)
    assert error["param"] == "messages[0].content[1].text"
    assert stack.sim.stats()["requests_received"] == 0


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (5, "messages[0].content"),
        ([5], "messages[0].content[0]"),
        ([{"text": "no type"}], "messages[0].content[0].type"),
    ],
)
def test_malformed_message_content_is_400_naming_the_field(
    stack: Stack, content: Any, param: str
) -> None:
    body = chat_body()
    body["messages"] = [{"role": "user", "content": content}]
    assert _error(_post(stack.url, body), 400)["param"] == param


def test_completion_prompt_of_the_wrong_type_is_400(stack: Stack) -> None:
    for prompt in (5, [1, {"a": 1}], None):
        r = httpx2.post(
            stack.url + "/v1/completions", json={"model": MODEL, "prompt": prompt}, timeout=10
        )
        assert _error(r, 400)["param"] == "prompt"


# -- row 2: deep nesting ----------------------------------------------------------------------


def _nested(depth: int) -> bytes:
    """A chat body whose ``metadata`` field nests lists to ``depth`` levels in all."""
    inner = b"[" * (depth - 1) + b"]" * (depth - 1)
    return (
        b'{"model":"' + MODEL.encode() + b'","messages":[{"role":"user","content":"x"}],'
        b'"max_tokens":2,"metadata":' + inner + b"}"
    )


@pytest.mark.parametrize("depth", [129, 254, 300, 1023, 1024, 1100, 5000])
def test_deep_nesting_is_400_json(stack: Stack, depth: int) -> None:
    error = _error(_post(stack.url, _nested(depth)), 400)
    assert "nest" in error["message"]
    assert stack.sim.stats()["requests_received"] == 0


def test_nesting_within_the_limit_is_served(stack: Stack) -> None:
    assert _post(stack.url, _nested(128)).status_code == 200


# -- row 7: Idempotency-Key bytes ---------------------------------------------------------------


@pytest.mark.parametrize("key", [b"tag\xff", b"tag\xfe", b"tag two", b"t\x7fg", "tägg".encode()])
def test_an_idempotency_key_that_is_not_visible_ascii_is_400(stack: Stack, key: bytes) -> None:
    error = _error(_post(stack.url, chat_body(), {"Idempotency-Key": key}), 400)
    # DEL is refused by the HTTP parser already (a JSON 400 from the server layer).
    assert error["param"] == "Idempotency-Key" or b"\x7f" in key
    assert stack.sim.stats()["requests_received"] == 0


def test_keys_that_differ_only_in_non_ascii_bytes_never_share_a_generation(stack: Stack) -> None:
    first = _post(stack.url, chat_body("a"), {"Idempotency-Key": b"tag\xff"})
    second = _post(stack.url, chat_body("b"), {"Idempotency-Key": b"tag\xfe"})
    assert first.status_code == second.status_code == 400
    ok = _post(stack.url, chat_body("c"), {"Idempotency-Key": "tag-ok_1.2~:/+="})
    assert ok.status_code == 200


# -- admin routes -----------------------------------------------------------------------------


def test_stats_and_metrics_need_the_admin_key_when_one_is_set() -> None:
    with make_stack(api_keys=("sk-tenant",), admin_key="sk-admin") as s:
        for path in ("/stats", "/metrics"):
            assert _error(httpx2.get(s.url + path), 401)["type"] == "authentication_error"
            tenant = httpx2.get(s.url + path, headers={"Authorization": "Bearer sk-tenant"})
            _error(tenant, 401)
            admin = httpx2.get(s.url + path, headers={"Authorization": "Bearer sk-admin"})
            assert admin.status_code == 200
        # The admin key is not a tenant key, and the health check stays open to load balancers.
        _error(post_stream(s.url, chat_body(), {"Authorization": "Bearer sk-admin"}), 401)
        assert httpx2.get(s.url + "/health").status_code == 200
        assert "sk-admin" not in s.gw.stats().__repr__()


@pytest.mark.parametrize("path", ["/stats", "/metrics", "/health", "/ready", "/v1/models"])
@pytest.mark.parametrize("method", ["POST", "DELETE", "PUT", "PATCH"])
def test_read_only_routes_answer_405_to_other_methods(stack: Stack, path: str, method: str) -> None:
    r = httpx2.request(method, stack.url + path, content=b"{}", timeout=10)
    _error(r, 405)
    assert "GET" in r.headers["allow"]


def test_ready_answers_like_health(stack: Stack) -> None:
    assert httpx2.get(stack.url + "/ready").status_code == 200


# -- unexpected exceptions ----------------------------------------------------------------------


def test_a_bug_in_a_handler_is_a_json_500_with_a_request_id_logged_and_counted(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    gw: Gateway = stack.gw
    monkeypatch.setattr(gw.registry, "open", broken)
    caplog.set_level(logging.ERROR, logger="streamsafe.gateway")
    r = _post(stack.url, chat_body())
    error = _error(r, 500)
    request_id = r.headers["x-request-id"]
    assert request_id and request_id in error["message"]
    assert error["type"] == "internal_error"
    assert "a bug" not in error["message"]  # internals stay in the log
    assert any(request_id in rec.getMessage() and rec.exc_info for rec in caplog.records)
    assert gw.stats()["errors"]["500"] == 1
    monkeypatch.undo()
    assert post_stream(stack.url, chat_body()).status_code == 200  # still serving


@pytest.mark.parametrize("path", ["/health", "/ready", "/v1/models"])
def test_read_only_routes_answer_head_like_get_without_a_body(stack: Stack, path: str) -> None:
    # Load balancers probe with HEAD: the status and headers of GET, no body.
    get = httpx2.get(stack.url + path, timeout=10)
    head = httpx2.head(stack.url + path, timeout=10)
    assert head.status_code == get.status_code == 200
    assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"]
