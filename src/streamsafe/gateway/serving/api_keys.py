"""Who calls: the tenant a request's API key names, and the admin key that guards ``/stats`` and
``/metrics`` and opens the engine's operator routes.

Keys are held by digest only: no API key stays in the gateway's memory as text, and a tenant is
known by a digest of its key (:func:`~streamsafe.gateway.serving.requests.tenant_id`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging

import orjson

from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.errors import BadRequest
from streamsafe.gateway.serving.requests import tenant_id
from streamsafe.server.asgi import Scope, header

__all__ = ["ANONYMOUS", "ApiKeys"]

log = logging.getLogger("streamsafe.gateway")

#: The one tenant of a gateway without API keys (nor a forwarded Authorization).
ANONYMOUS = "anonymous"

#: The request fields of the Responses API that read what another request stored on the engine.
STATE_FIELDS = ("previous_response_id", "conversation")
_TENANT_STATE = (
    "this request reads what another request stored on the engine, which tenants share under "
    "the gateway's one upstream identity (tenant_passthrough, --tenant-passthrough)"
)


def reads_stored_state(raw: bytes) -> bool:
    """Whether a Responses request body names what another request stored on the engine
    (:data:`STATE_FIELDS` not null); parsed only where one of the names is in it."""
    if b'"previous_response_id"' not in raw and b'"conversation"' not in raw:
        return False
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False  # refused as unreadable where the request is read
    return isinstance(body, dict) and any(body.get(k) is not None for k in STATE_FIELDS)


class ApiKeys:
    """The gateway's ``api_keys`` (one tenant each) and its ``admin_key``. Without API keys
    every caller is :data:`ANONYMOUS`, or with ``forward_authorization`` the tenant its
    credential names; without an admin key the admin routes are open (a warning says so where
    API keys are set)."""

    def __init__(self, config: GatewayConfig) -> None:
        self._forward_authorization = config.forward_authorization
        #: Tenants are refused what is stored upstream (their shared upstream identity).
        self._refuse_state = (
            config.tenant_passthrough == "refuse" and not config.forward_authorization
        )
        self._tenants = {
            hashlib.sha256(k.strip().encode()).digest(): tenant_id(k.strip().encode())
            for k in config.api_keys
        }
        admin = config.admin_key
        self._admin_digest = hashlib.sha256(admin.encode()).digest() if admin else None
        if self._tenants and self._admin_digest is None:
            log.warning("API keys are set but no admin key: /stats and /metrics are open")

    def check_tenant_state(self, tenant: str | None) -> None:
        """Raise 403 where ``tenant`` may not read what is stored upstream: the tenants share the
        gateway's one upstream identity there (``tenant_passthrough`` ``refuse``, no
        ``forward_authorization``)."""
        if self._refuse_state and tenant not in (None, ANONYMOUS):
            raise BadRequest(403, _TENANT_STATE)

    def tenant(self, scope: Scope) -> str:
        """The tenant the request's ``Authorization: Bearer`` key names; raises a 401
        :class:`~streamsafe.gateway.errors.BadRequest` for a missing or unknown key."""
        if not self._tenants:
            if self._forward_authorization:
                # The upstream authenticates: each credential is its own tenant, known here by
                # its digest only (the credential itself goes upstream).
                auth = header(scope, b"authorization")
                return ANONYMOUS if auth is None else tenant_id(auth.strip())
            return ANONYMOUS
        auth = header(scope, b"authorization")
        if auth is not None:
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() == b"bearer" and token:
                tenant = self._tenants.get(hashlib.sha256(token.strip()).digest())
                if tenant is not None:
                    return tenant
            raise BadRequest(401, "invalid API key")
        raise BadRequest(401, "missing API key: send Authorization: Bearer <key>")

    def check_admin(self, scope: Scope) -> None:
        """Raise a 401 :class:`~streamsafe.gateway.errors.BadRequest` unless the request
        carries the admin key (where one is set)."""
        if self._admin_digest is None:
            return
        auth = header(scope, b"authorization")
        if auth is None:
            raise BadRequest(401, "missing admin key: send Authorization: Bearer <admin key>")
        scheme, _, token = auth.partition(b" ")
        digest = hashlib.sha256(token.strip()).digest()
        if scheme.lower() != b"bearer" or not hmac.compare_digest(digest, self._admin_digest):
            raise BadRequest(401, "invalid admin key")

    def check_operator(self, scope: Scope) -> None:
        """Raise a 403 :class:`~streamsafe.gateway.errors.BadRequest` unless the request
        carries the admin key: an operator route (``/sleep``, ``/reset_prefix_cache``, ...)
        changes or reveals the engine for every tenant, so it is closed where no admin key is
        set, unlike ``/metrics``."""
        if self._admin_digest is None:
            raise BadRequest(403, _OPERATOR_CLOSED + " (the gateway has no admin key)")
        auth = header(scope, b"authorization")
        scheme, _, token = (auth or b"").partition(b" ")
        digest = hashlib.sha256(token.strip()).digest()
        if scheme.lower() != b"bearer" or not hmac.compare_digest(digest, self._admin_digest):
            raise BadRequest(403, _OPERATOR_CLOSED + ": send Authorization: Bearer <admin key>")


_OPERATOR_CLOSED = "an operator route of the engine answers the gateway's admin key only"
