"""An engine's KV capacity learned from vLLM's /metrics (upstream/capacity.py): the pure reading
of the page, and the pool bounding what it sends to an engine by what the engine said it holds."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from streamsafe.gateway.engines.pool import Counts, EngineSpec, Pool
from streamsafe.gateway.upstream.breaker import EngineBreaker
from streamsafe.gateway.upstream.capacity import kv_capacity


def _pool(specs: Sequence[EngineSpec]) -> Pool:
    """A pool of ``specs``, each engine with plain load counts and a breaker of its own."""
    return Pool(specs, [Counts() for _ in specs], [EngineBreaker() for _ in specs])


pytestmark = pytest.mark.unit

# As prometheus_client writes vLLM's info gauge (labels are CacheConfig's fields, abridged).
PAGE = b"\n".join(
    [
        b"# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        b"# TYPE vllm:cache_config_info gauge",
        b'vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",'
        b'kv_cache_size_tokens="2048",num_cpu_blocks="None",num_gpu_blocks="16",'
        b'prefix_caching_hash_algo="sha256"} 1.0',
        b"# HELP vllm:num_requests_running Number of requests in model execution batches.",
        b'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0',
        b"",
    ]
)


def test_the_capacity_is_read_from_the_cache_config_info_gauge() -> None:
    found = kv_capacity(PAGE)
    assert found is not None and found.tokens == 2048
    assert "kv_cache_size_tokens=2048" in found.source


def test_blocks_times_block_size_where_the_token_count_is_not_published() -> None:
    page = PAGE.replace(b'kv_cache_size_tokens="2048"', b'kv_cache_size_tokens="None"')
    found = kv_capacity(page)
    assert found is not None and found.tokens == 16 * 128
    assert "num_gpu_blocks=16 x block_size=128" in found.source


def test_data_parallel_engines_add_up() -> None:
    line = PAGE.splitlines()[2]
    page = line + b"\n" + line.replace(b'engine="0"', b'engine="1"') + b"\n"
    found = kv_capacity(page)
    assert found is not None and found.tokens == 4096


def test_a_page_without_a_usable_figure_says_nothing() -> None:
    assert kv_capacity(b"") is None
    assert kv_capacity(b"vllm:num_requests_running 0.0\n") is None
    unmeasured = PAGE.replace(b'kv_cache_size_tokens="2048"', b"").replace(
        b'num_gpu_blocks="16"', b'num_gpu_blocks="None"'
    )
    assert kv_capacity(unmeasured) is None
    assert kv_capacity(b'vllm:cache_config_info{block_size="x\\"y"} 1.0\n') is None


def test_a_learned_capacity_bounds_the_engine_where_the_operator_set_none() -> None:
    pool = _pool([EngineSpec("http://a"), EngineSpec("http://b", memory=500)])
    unbounded, bounded = pool.engines
    assert unbounded.memory is None and unbounded.has_room(10**9)
    unbounded.learned_memory = 2048
    assert unbounded.has_room(2048) and not unbounded.has_room(2049)
    bounded.learned_memory = 10**6  # the operator's memory= wins
    assert bounded.memory == 500
