"""The Grafana dashboard is generated from the metric definitions, kept up to date, and every
query names a metric the gateway exports."""

from __future__ import annotations

import pathlib
import re

import httpx2
from gateway_helpers import chat_body, fast_sim
from prometheus_client.parser import text_string_to_metric_families

from server_stops import stop_later
from streamsafe.engine_sim import Simulator
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.gateway.metrics.counters import PREFIX
from streamsafe.gateway.metrics.dashboard import DEFAULT_PATH, dashboard, queries, render
from streamsafe.gateway.metrics.exposition import series
from streamsafe.server import ServerThread

ROOT = pathlib.Path(__file__).resolve().parents[2]
_NAME = re.compile(PREFIX + r"[a-z0-9_]+")


def _exported(text: str) -> set[str]:
    """Every sample name the exposition ``text`` carries or declares (an empty family, such as
    the errors of a gateway that refused nothing yet, still declares its name)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def test_the_dashboard_file_is_generated_from_the_metrics() -> None:
    committed = (ROOT / DEFAULT_PATH).read_text()
    assert committed == render(), "stale: run `make docs`"


def test_every_query_names_a_metric_a_pool_of_two_exports() -> None:
    engines = [ServerThread(Simulator(fast_sim())).start() for _ in range(2)]
    urls = tuple(e.url for e in engines)
    gw = Gateway(GatewayConfig(upstream=urls[0], engines=urls, heartbeat=0.05))
    try:
        with ServerThread(gw) as server:
            r = httpx2.post(server.url + "/v1/chat/completions", json=chat_body(), timeout=10)
            assert r.status_code == 200
            exported = _exported(httpx2.get(server.url + "/metrics").text)
    finally:
        stop_later(*engines)
    named = {name for expr in queries(dashboard()) for name in _NAME.findall(expr)}
    assert named, "no query found"
    assert named <= exported, sorted(named - exported)


def test_every_series_has_a_panel() -> None:
    panels = [p for p in dashboard()["panels"] if p["type"] == "timeseries"]
    described = {p["description"] for p in panels}
    assert {doc for _name, doc, _kind in series()} <= described
    assert len({p["id"] for p in dashboard()["panels"]}) == len(dashboard()["panels"])
