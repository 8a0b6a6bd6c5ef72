"""The gateway's parts built from its configuration: the engine pool (one upstream is a pool of
one), admission, and the fleet of replicas this process is one of (the Redis fleet, or itself
alone). :class:`~streamsafe.gateway.app.Gateway` puts them together and serves requests.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from streamsafe.gateway.admission.admission import Admission
from streamsafe.gateway.config import GatewayConfig
from streamsafe.gateway.engines.engines import Engines
from streamsafe.gateway.engines.pool import parse_engine, parse_fallback
from streamsafe.gateway.generations.fleet import Fleet
from streamsafe.gateway.generations.solo import Solo
from streamsafe.gateway.generations.store import MemoryStore
from streamsafe.gateway.replicas.replicas import Replicas
from streamsafe.gateway.replicas.store_redis import RedisStore
from streamsafe.gateway.serving.requests import tenant_id

__all__ = ["build_admission", "build_engines", "build_fleet"]

log = logging.getLogger("streamsafe.gateway")


def build_engines(config: GatewayConfig) -> Engines:
    """The engine pool of ``config``'s engines, or of its one upstream: one upstream is a pool of
    one engine, with the same picks, failover, breaker and reader."""
    if config.upstream is None:
        raise ValueError("GatewayConfig.upstream is required (streamsafe serve starts one)")
    return _engines(config, config.engines or (config.upstream,))


def build_admission(config: GatewayConfig) -> Admission:
    """Admission as ``config`` bounds it, each tenant's share weighted as it says."""
    return Admission(
        max_inflight=config.max_inflight,
        max_memory_tokens=config.max_memory_tokens,
        queue_size=config.queue_size,
        queue_timeout=config.queue_timeout,
        weights={tenant_id(k.strip().encode()): w for k, w in config.tenant_weights},
    )


def build_fleet(config: GatewayConfig, store: MemoryStore | None) -> Fleet:
    """The replicas this process is one of: with ``config.redis_url`` and no ``store``, the
    fleet that shares its generations through Redis; else this process alone over ``store``
    (default: a fresh :class:`MemoryStore`)."""
    if store is None and config.redis_url is not None:
        return _replicas(config, config.redis_url)
    return Solo(store or MemoryStore())


def _engines(config: GatewayConfig, specs: Sequence[str]) -> Engines:
    """The engine pool of ``specs`` (``config``'s engines, or its one upstream), set up as
    ``config`` says."""
    return Engines(
        [parse_engine(text) for text in specs],
        fallbacks=dict(parse_fallback(text) for text in config.fallback_models),
        connect_timeout=config.connect_timeout,
        connect_retries=config.connect_retries,
        connect_backoff=config.connect_backoff,
        max_keepalive=config.max_keepalive,
        api_key=config.upstream_api_key,
        kind=config.upstream_kind,
        ca_bundle=config.upstream_ca_bundle,
        max_attempts=config.failover_attempts,
        probe_interval=config.probe_interval,
        queue_timeout=config.queue_timeout,
        continuations=config.max_continuations,
        total_timeout=config.total_timeout,
        answer_refusals=config.engine_refusals == "answer",
    )


def _replicas(config: GatewayConfig, redis_url: str) -> Replicas:
    """This replica in the fleet that shares its generations through Redis at ``redis_url``."""
    redis_store = RedisStore(redis_url, secret=config.redis_secret, ca_certs=config.redis_ca_certs)
    if config.redis_secret is None:
        log.warning(
            "no Redis secret: prompts and answers are kept in Redis in clear and provider "
            "data not at all (another replica cannot continue a generation that carried it); "
            "give every replica the same --redis-secret to seal them"
        )
    return Replicas(
        redis_store,
        lease=config.lease,
        keep_finished=config.keep_finished,
        orphan_ttl=config.orphan_ttl,
    )
