"""How many tokens an engine holds at once, learned from the engine itself.

vLLM publishes its KV cache configuration in ``/metrics`` as the info gauge
``vllm:cache_config_info``, one series per data-parallel engine, whose labels are the
``CacheConfig`` fields: ``kv_cache_size_tokens`` (the capacity in tokens, right for hybrid models
too) and ``num_gpu_blocks`` x ``block_size``. Where the operator gave an engine no ``memory=``,
the gateway learns that capacity at start (:func:`learn_kv_capacity`) and admits to the engine no
more than it holds, so the default gateway never lets a storm past the engine's memory
(docs/design.md, Admission). :func:`kv_capacity` is the pure reading of the metrics text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from streamsafe.gateway.upstream.transport import ConnectionPool

__all__ = ["KVCapacity", "kv_capacity", "learn_kv_capacity"]

_INFO = b"vllm:cache_config_info{"
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
#: Largest metrics page read (vLLM's is some 100 KiB).
_MAX_METRICS = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class KVCapacity:
    """An engine's KV cache: ``tokens`` in all, and how that was read (for the log)."""

    tokens: int
    source: str


def kv_capacity(metrics: bytes) -> KVCapacity | None:
    """The KV capacity in a Prometheus text page of vLLM's, summed over its engines; ``None``
    where the page holds no usable ``vllm:cache_config_info``."""
    total, parts = 0, []
    for line in metrics.split(b"\n"):
        if not line.startswith(_INFO):
            continue
        labels = dict(
            _LABEL.findall(line[len(_INFO) : line.rfind(b"}")].decode("utf-8", "replace"))
        )
        tokens, how = _tokens(labels)
        if tokens is None:
            continue
        total += tokens
        parts.append(how)
    if not parts:
        return None
    return KVCapacity(total, "; ".join(parts))


def _tokens(labels: dict[str, str]) -> tuple[int | None, str]:
    size = _positive(labels.get("kv_cache_size_tokens"))
    if size is not None:
        return size, f"kv_cache_size_tokens={size}"
    blocks = _positive(labels.get("num_gpu_blocks"))
    block = _positive(labels.get("block_size"))
    if blocks is None or block is None:
        return None, ""
    return blocks * block, f"num_gpu_blocks={blocks} x block_size={block}"


def _positive(text: str | None) -> int | None:
    if text is None or not text.isdigit():
        return None  # "None" before the engine measured it
    value = int(text)
    return value if value > 0 else None


async def learn_kv_capacity(pool: ConnectionPool) -> KVCapacity | None:
    """Ask the engine behind ``pool`` for ``/metrics`` and read its KV capacity; ``None`` where
    it does not answer 200 with one. Not bounded in time (the caller bounds it); raises
    :class:`~streamsafe.gateway.upstream.errors.UpstreamError` where the request fails."""
    response = await pool.call("GET", "/metrics", limit=_MAX_METRICS)
    return kv_capacity(response.body) if response.status == 200 else None
