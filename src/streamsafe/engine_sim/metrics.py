"""``/metrics``: the simulator's state in Prometheus text format, under vLLM's metric names, so
dashboards and autoscalers written for vLLM read the simulator unchanged."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["render_metrics"]

_GAUGES = (
    (
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        "active",
    ),
    (
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        "waiting",
    ),
)
_COUNTERS: tuple[tuple[str, str, str | None], ...] = (
    ("vllm:generation_tokens_total", "Number of generation tokens processed.", "tokens_generated"),
    ("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", None),
    (
        "streamsafe_sim:requests_received_total",
        "Completion requests received.",
        "requests_received",
    ),
    (
        "streamsafe_sim:generations_aborted_total",
        "Generations aborted on disconnect.",
        "generations_aborted",
    ),
    (
        "streamsafe_sim:generations_failed_total",
        "Generations failed by engine death.",
        "generations_failed",
    ),
    ("streamsafe_sim:crashes_total", "Engine deaths (out of memory).", "crashes"),
    (
        "streamsafe_sim:tokens_unread_total",
        "Tokens generated that no client read.",
        "tokens_unread",
    ),
)


def _label(model: str) -> str:
    escaped = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{{model_name="{escaped}"}}'


def render_metrics(model: str, stats: Mapping[str, Any], kv_tokens: int | None = None) -> str:
    """Prometheus exposition text (format 0.0.4) for a ``/stats`` snapshot; with
    ``kv_tokens``, vLLM's cache configuration gauge saying the engine holds that many tokens
    (one block of that size: the simulator has no paging)."""
    label = _label(model)
    lines: list[str] = []
    if kv_tokens is not None:
        name = "vllm:cache_config_info"
        lines += [
            f"# HELP {name} Information of the LLMEngine CacheConfig",
            f"# TYPE {name} gauge",
            f'{name}{{block_size="{kv_tokens}",engine="0",kv_cache_size_tokens="{kv_tokens}",'
            f'num_gpu_blocks="1"}} 1.0',
        ]
    for name, kind, help_text, key in _GAUGES:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines.append(f"{name}{label} {float(stats[key])}")
    name = "vllm:kv_cache_usage_perc"
    usage = stats["memory_used_tokens"] / max(1, stats["memory_capacity_tokens"])
    lines += [f"# HELP {name} KV-cache usage. 1 means 100 percent usage.", f"# TYPE {name} gauge"]
    lines.append(f"{name}{label} {usage}")
    lines += [
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{finished_reason="length",{label[1:-1]}}} '
        f"{float(stats['generations_completed'])}",
    ]
    for name, help_text, source in _COUNTERS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
        lines.append(f"{name}{label} {float(stats[source]) if source else 0.0}")
    name = "streamsafe_sim:engine_dead"
    lines += [f"# HELP {name} 1 while the engine is dead.", f"# TYPE {name} gauge"]
    lines.append(f"{name}{label} {1.0 if stats['engine_dead'] else 0.0}")
    return "\n".join(lines) + "\n"
