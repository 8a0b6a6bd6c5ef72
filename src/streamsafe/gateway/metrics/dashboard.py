"""A Grafana dashboard for the gateway, generated from its metric definitions.

Every series :func:`~streamsafe.gateway.metrics.exposition.series` lists gets a panel, so a
series added is on the dashboard at the next ``make docs``: a counter as its rate, a gauge as its
value, a per-engine series per ``engine``, a histogram as its p50/p95/p99, a per-route histogram
as its p95 by route (and its rate by route, model and status), a per-route counter by route and
model. Rows group them as an operator
reads them (traffic, latency, admission, engines, replicas); a series no row names lands in
"Other". The queries name only series the gateway exports (``tests/gateway/test_dashboard.py``
checks each against ``/metrics``), summed over the instances the ``instance`` variable selects.

``python -m streamsafe.gateway.metrics.dashboard --write [PATH]`` writes it (default
``deploy/grafana/streamsafe-gateway.json``); import that file into Grafana and pick the
Prometheus data source that scrapes the gateways' ``/metrics``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streamsafe.gateway.metrics.counters import PREFIX
from streamsafe.gateway.metrics.exposition import series

__all__ = ["DEFAULT_PATH", "ROWS", "dashboard", "main", "queries"]

DEFAULT_PATH = "deploy/grafana/streamsafe-gateway.json"

#: (row title, series names without the prefix), in the order the dashboard shows them.
ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "Traffic",
        (
            "requests_received",
            "errors",
            "retries_seen",
            "attached",
            "replayed",
            "resumed",
            "generations_started",
            "generations_completed",
            "generations_failed",
            "generations_aborted",
            "continued",
            "passed_through",
            "events_relayed",
            "key_conflicts",
            "usage_recovered",
        ),
    ),
    (
        "Latency",
        (
            "time_to_first_token_seconds",
            "request_duration_seconds",
            "admission_wait_seconds",
            "completion_tokens",
        ),
    ),
    (
        "Routes and models",
        (
            "route_request_duration_seconds",
            "route_time_per_output_token_seconds",
            "route_prompt_tokens",
            "route_completion_tokens",
        ),
    ),
    (
        "Admission",
        (
            "queued",
            "inflight",
            "memory_tokens",
            "shed",
            "engine_sheds",
            "subscribers",
            "live_generations",
            "kept_generations",
            "kept_bytes",
            "evicted",
        ),
    ),
    (
        "Engines",
        (
            "engine_requests",
            "engine_failures",
            "engine_breaker_state",
            "engine_breaker_trips",
            "engine_memory_tokens",
            "breaker_open",
            "breaker_trips",
            "breaker_rejections",
            "upstream_failures",
            "upstream_timeouts",
            "upstream_connect_retries",
            "engine_failovers",
            "engine_migrations",
        ),
    ),
    (
        "Replicas",
        (
            "fleet_replicas",
            "redis_degraded",
            "redis_errors",
            "redis_used_memory_bytes",
            "generations_mirrored",
            "generations_taken_over",
            "leases_lost",
        ),
    ),
)

_SELECT = '{instance=~"$instance"}'
_WIDTH = 8
_HEIGHT = 7


def _targets(name: str, kind: str) -> list[dict[str, str]]:
    """The queries of one series' panel (``name`` with the prefix)."""
    if kind == "histogram":
        return [
            {
                "expr": f"histogram_quantile({q}, sum by (le) "
                f"(rate({name}_bucket{_SELECT}[$__rate_interval])))",
                "legendFormat": f"p{round(q * 100)}",
            }
            for q in (0.5, 0.95, 0.99)
        ]
    if kind == "route_histogram":
        by = "route, status" if "duration" in name else "route, model"
        legend = "{{route}} {{status}}" if "duration" in name else "{{route}} {{model}}"
        targets = [
            {
                "expr": f"histogram_quantile(0.95, sum by (le, {by}) "
                f"(rate({name}_bucket{_SELECT}[$__rate_interval])))",
                "legendFormat": f"p95 {legend}",
            }
        ]
        if "duration" in name:
            targets.append(
                {
                    "expr": f"sum by (route, model, status) "
                    f"(rate({name}_count{_SELECT}[$__rate_interval]))",
                    "legendFormat": "{{route}} {{model}} {{status}} per second",
                }
            )
        return targets
    if kind == "route_counter":
        expr = f"sum by (route, model) (rate({name}_total{_SELECT}[$__rate_interval]))"
        return [{"expr": expr, "legendFormat": "{{route}} {{model}}"}]
    if kind == "engine_counter":
        expr = f"sum by (engine) (rate({name}_total{_SELECT}[$__rate_interval]))"
        return [{"expr": expr, "legendFormat": "{{engine}}"}]
    if kind == "engine_gauge":
        return [{"expr": f"max by (engine) ({name}{_SELECT})", "legendFormat": "{{engine}}"}]
    if name == PREFIX + "errors":
        expr = f"sum by (status) (rate({name}_total{_SELECT}[$__rate_interval]))"
        return [{"expr": expr, "legendFormat": "{{status}}"}]
    if kind == "counter":
        expr = f"sum(rate({name}_total{_SELECT}[$__rate_interval]))"
        return [{"expr": expr, "legendFormat": "per second"}]
    return [{"expr": f"sum({name}{_SELECT})", "legendFormat": "all instances"}]


def _unit(name: str, kind: str) -> str:
    if name.endswith("_seconds"):
        return "s"
    if name.endswith("_bytes"):
        return "bytes"
    if name.endswith("_tokens"):
        return "short"
    return "reqps" if kind.endswith("counter") else "short"


def _panel(panel_id: int, name: str, doc: str, kind: str, x: int, y: int) -> dict[str, Any]:
    short = name.removeprefix(PREFIX)
    rate = kind.endswith("counter")
    targets = _targets(name, kind)
    for ref, target in zip("ABCDEFGH", targets, strict=False):
        target["refId"] = ref
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": short.replace("_", " ") + (" (per second)" if rate else ""),
        "description": doc,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": _HEIGHT, "w": _WIDTH, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": _unit(short, kind)}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": targets,
    }


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (see the module)."""
    return {
        "title": "streamsafe gateway",
        "uid": "streamsafe-gateway",
        "description": "Generated from streamsafe.gateway.metrics by "
        "streamsafe.gateway.metrics.dashboard; do not edit by hand (make docs regenerates it).",
        "tags": ["streamsafe"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": _VARIABLES},
        "panels": _panels(),
    }


#: The data source and the gateways the dashboard shows, chosen at its top.
_VARIABLES = [
    {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
    {
        "name": "instance",
        "label": "Gateway",
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": f"label_values({PREFIX}requests_received_total, instance)",
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "refresh": 2,
    },
]


def _panels() -> list[dict[str, Any]]:
    """A row per group of :data:`ROWS` (and "Other" for a series no row names), a panel per
    series, laid out left to right, :data:`_WIDTH` wide."""
    defined = {name.removeprefix(PREFIX): (name, doc, kind) for name, doc, kind in series()}
    placed = {short for _title, names in ROWS for short in names}
    rows = [*ROWS]
    other = tuple(short for short in defined if short not in placed)
    if other:
        rows.append(("Other", other))
    panels: list[dict[str, Any]] = []
    y = 0
    for title, names in rows:
        grid = {"h": 1, "w": 24, "x": 0, "y": y}
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": grid,
                "panels": [],
            }
        )
        y += 1
        column = 0
        for short in names:
            if short not in defined:
                continue  # a row names a series the metrics module no longer has
            name, doc, kind = defined[short]
            panels.append(_panel(len(panels) + 1, name, doc, kind, column * _WIDTH, y))
            column += 1
            if column * _WIDTH >= 24:
                column = 0
                y += _HEIGHT
        if column:
            y += _HEIGHT
    return panels


def queries(board: dict[str, Any]) -> list[str]:
    """Every query expression of ``board`` (panels and variables)."""
    found = [t["expr"] for p in board["panels"] for t in p.get("targets", ())]
    found += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return found


def render() -> str:
    """The dashboard file's text."""
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m streamsafe.gateway.metrics.dashboard [--write [PATH]]``: print the dashboard, or
    write it (default :data:`DEFAULT_PATH`)."""
    ap = argparse.ArgumentParser(prog="python -m streamsafe.gateway.metrics.dashboard")
    ap.add_argument("--write", nargs="?", const=DEFAULT_PATH, default=None, metavar="PATH")
    args = ap.parse_args(argv)
    text = render()
    if args.write is None:
        sys.stdout.write(text)
    else:
        path = Path(args.write)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
