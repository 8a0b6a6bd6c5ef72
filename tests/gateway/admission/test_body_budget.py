"""The request bodies queued and running generations hold are bounded as a whole (issue 23,
row 8): ~4.2 MB of memory per queued 4 MiB body, 1,024 of them in the default queue, was ~4 GB."""

from __future__ import annotations

import threading

import httpx2
import pytest
from gateway_helpers import chat_body, fast_sim, make_stack, wait_for

from streamsafe.gateway import GatewayConfig
from streamsafe.gateway.admission.body_budget import BodyBudget

_KB = 1024


def test_bodies_fit_until_the_budget_and_a_tenant_within_its_share_always_does() -> None:
    budget = BodyBudget(100)
    assert budget.fits("a", 1_000)  # alone larger than the budget: max_body_bytes bounds it
    budget.hold("g1", "a", 60)
    assert budget.fits("a", 40) and not budget.fits("a", 41)
    budget.hold("g2", "a", 40)
    # Tenant b holds nothing: its share is half the budget (two tenants would hold bodies).
    assert budget.fits("b", 50) and not budget.fits("b", 51)
    budget.hold("g3", "b", 50)
    assert budget.bytes == 150 <= 2 * budget.limit
    assert not budget.fits("a", 1) and not budget.fits("b", 1)
    budget.drop("g1")
    budget.drop("g1")  # once only
    assert budget.bytes == 90 and budget.fits("a", 10)
    for gen in ("g2", "g3"):
        budget.drop(gen)
    assert budget.bytes == 0


def test_max_live_body_bytes_is_at_least_the_body_limit() -> None:
    with pytest.raises(ValueError):
        GatewayConfig(max_body_bytes=2 * _KB, max_live_body_bytes=_KB)


def test_queued_bodies_past_the_budget_are_shed_with_429_but_not_another_tenant_s() -> None:
    sim = fast_sim(itl_ms=50.0, memory_tokens=10**7)
    config = {
        "api_keys": ("key-a", "key-b"),
        "max_inflight": 1,
        "max_body_bytes": 512 * _KB,
        "max_live_body_bytes": 1024 * _KB,
    }
    with make_stack(sim, **config) as s:
        url = s.url + "/v1/chat/completions"

        def post(key: str, i: int) -> httpx2.Response:
            body = chat_body(content=f"{i} " + "x" * 300 * _KB, max_tokens=10, stream=False)
            headers = {"authorization": f"Bearer {key}"}
            return httpx2.post(url, json=body, headers=headers, timeout=60)

        answers: list[int] = []
        waiting = [
            threading.Thread(target=lambda i=i: answers.append(post("key-a", i).status_code))
            for i in range(3)
        ]
        for t in waiting:
            t.start()
        wait_for(lambda: s.gw.registry.live_generations == 3, what="three bodies live")
        shed = post("key-a", 3)  # a fourth of tenant a's: over the budget, and over its share
        assert shed.status_code == 429, shed.text
        assert int(shed.headers["retry-after"]) >= 1
        assert "memory budget" in shed.json()["error"]["message"]
        other = post("key-b", 4)  # tenant b holds nothing: within its share, queued and served
        assert other.status_code == 200, other.text
        for t in waiting:
            t.join(60)
        assert answers == [200, 200, 200]
        assert s.gw.registry.bodies.bytes == 0  # every body let go with its generation
        assert s.gw.stats()["shed"] >= 1
