"""Path spellings (issue 23, rows 2 and 6): no spelling of a path reaches an upstream's
completion route around admission and coalescing, and nothing reaches outside the
``--upstream`` prefix. The gateway passes through to an upstream that records every path it is
sent; requests go over a raw socket, since HTTP clients resolve dot segments before they send."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from path_helpers import BODY, PREFIX, PROBE, PathStack, lenient, path_stack


@pytest.fixture(scope="module")
def stack() -> Iterator[PathStack]:
    with path_stack() as s:
        yield s


@pytest.mark.parametrize(
    "target",
    [
        b"/v1/x/../chat/completions",
        b"/v1/./chat/completions",
        b"/v1/x/%2e%2e/chat/completions",
        b"/v1/x/%2E%2e/chat/completions",
        b"/v1/x/..%2Fchat/completions",
        b"/v1/x/..;/chat/completions",
        b"/v1/x\\..\\chat/completions",
        b"/v1/x/%5c..%5Cchat/completions",
        b"/v1/chat/completions/.",
    ],
)
def test_dot_segment_spellings_of_a_completion_route_are_refused(
    stack: PathStack, target: bytes
) -> None:
    # Routed on as they came, these were no route of the gateway's and went through, where
    # httpx (or the upstream) resolved them to the completion route: no admission, no
    # coalescing, and generations_started stayed 0.
    before = len(stack.recorder.seen)
    status, body = stack.send(b"POST", target, BODY)
    assert status == 400, body
    assert "dot segments" in orjson.loads(body)["error"]["message"]
    assert len(stack.recorder.seen) == before


@pytest.mark.parametrize(
    "target",
    [
        b"/v1//chat/completions",
        b"//v1/chat/completions",
        b"/v1/chat/completions/",
        b"/v1/chat/%63ompletions",
        b"/v1/chat%2Fcompletions",
    ],
)
def test_other_spellings_of_a_completion_route_are_served_by_the_gateway(
    stack: PathStack, target: bytes
) -> None:
    # A spelling an upstream may route to its completion route is the gateway's route too:
    # admitted and coalesced like the plain one, and sent upstream as the plain one.
    started = stack.gw.stats()["generations_started"]
    status, body = stack.send(b"POST", target, BODY)
    assert status == 200, body
    assert stack.gw.stats()["generations_started"] == started + 1
    path, headers = stack.recorder.seen[-1]
    assert path == (PREFIX + "/v1/chat/completions").encode() and PROBE not in headers


@pytest.mark.parametrize(
    "target",
    [
        b"/../../metrics",
        b"/%2e%2e/%2e%2e/metrics",
        b"/..%2f..%2fmetrics",
        b"/v1/models/..%2F..%2F..%2F..%2Fmetrics",
        b"/v1/files/%2E./%2E./%2E./metrics",
    ],
)
def test_nothing_reaches_outside_the_upstream_prefix(stack: PathStack, target: bytes) -> None:
    before = len(stack.recorder.seen)
    status, _ = stack.send(b"GET", target)
    assert status == 400
    assert len(stack.recorder.seen) == before


def test_an_encoded_slash_inside_a_segment_is_passed_through_as_sent(stack: PathStack) -> None:
    # openai-python encodes a model id's slash (models.retrieve("vllm/tiny")).
    status, _ = stack.send(b"GET", b"/v1/models/vllm%2Ftiny?x=1")
    assert status == 200
    assert stack.recorder.probes()[-1] == (PREFIX + "/v1/models/vllm%2Ftiny").encode()
    assert lenient(stack.recorder.probes()[-1]).startswith(PREFIX + "/")
