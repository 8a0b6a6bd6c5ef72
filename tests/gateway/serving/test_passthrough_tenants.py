"""Pass-through and tenants (issue 23, row 7): every tenant reaches the upstream under the
gateway's one upstream identity, so what the upstream stores (Llama Stack's stored completions,
responses, files, vector stores, agents) would be shared between them. With API keys set, only
routes that hold no tenant's data pass unless ``tenant_passthrough="shared"`` says otherwise."""

from __future__ import annotations

import orjson
import pytest
from path_helpers import BODY, PREFIX, path_stack

from streamsafe.gateway import GatewayConfig

KEYS = ("key-a", "key-b")
TENANT_DATA = [
    (b"GET", b"/v1/chat/completions"),  # Llama Stack lists stored completions here
    (b"GET", b"/v1/chat/completions/chatcmpl-1"),
    (b"GET", b"/v1/files"),
    (b"POST", b"/v1/files"),
    (b"GET", b"/v1/responses/resp-1"),
    (b"POST", b"/v1/vector_stores"),
    (b"DELETE", b"/v1/models/vllm%2Ftiny"),
]
SHARED = [
    (b"GET", b"/v1/models"),
    (b"GET", b"/v1/models/vllm%2Ftiny"),
    (b"HEAD", b"/v1/health"),
    (b"GET", b"/v1/version"),
]


def test_tenants_pass_through_only_routes_that_hold_no_tenant_s_data_by_default() -> None:
    # Each of these went upstream under the one --upstream-api-key, for any tenant.
    with path_stack(api_keys=KEYS) as stack:
        for method, target in TENANT_DATA:
            status, body = stack.send(method, target, b"{}" if method == b"POST" else b"", b"key-a")
            assert status == 403, (method, target, body)
            assert orjson.loads(body)["error"]["type"] == "permission_error"
        assert stack.recorder.probes() == []
        for method, target in SHARED:
            status, _ = stack.send(method, target, key=b"key-b")
            assert status == 200, (method, target)
        assert [p.removeprefix(PREFIX.encode()) for p in stack.recorder.probes()] == [
            target for _, target in SHARED
        ]
        # The served completion routes are the gateway's own, tenants apart (not passed).
        assert stack.send(b"POST", b"/v1/chat/completions", BODY, b"key-a")[0] == 200
        assert stack.send(b"GET", b"/v1/files")[0] == 401  # and a key is still needed


def test_shared_tenant_passthrough_passes_every_route_as_set() -> None:
    with path_stack(api_keys=KEYS, tenant_passthrough="shared") as stack:
        for method, target in TENANT_DATA:
            body = b"{}" if method == b"POST" else b""
            assert stack.send(method, target, body, b"key-a")[0] == 200, (method, target)
        assert len(stack.recorder.probes()) == len(TENANT_DATA)


def test_without_api_keys_there_is_one_tenant_and_everything_passes() -> None:
    with path_stack() as stack:
        for method, target in TENANT_DATA:
            body = b"{}" if method == b"POST" else b""
            assert stack.send(method, target, body)[0] == 200, (method, target)


def test_tenant_passthrough_is_checked() -> None:
    with pytest.raises(ValueError):
        GatewayConfig(tenant_passthrough="everyone")  # type: ignore[arg-type]
