"""An upstream URL that carries credentials (``http://user:password@host``): the password goes
to the engine, as Basic authorization, on every connection (the hot stream's and the pooled
client's), and nowhere else: not in the start line, a probe or access line, ``/stats`` or
``/metrics``, nor an error message."""

from __future__ import annotations

import asyncio
import base64

import httpx2
import pytest
from gateway_helpers import MODEL, chat_body, fast_sim
from hypothesis import given
from hypothesis import strategies as st

from streamsafe._url_userinfo import redact, split_userinfo
from streamsafe.engine_sim import Simulator
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.gateway.engines.pool import parse_engine
from streamsafe.gateway.upstream.connection import Upstream
from streamsafe.server import ServerThread
from streamsafe_bench.processes import ServerProcess
from waiting import wait_until

PASSWORD = "Pa55-w0rd-7c1f"


def _with_credentials(url: str, user: str = "gw-user", password: str = PASSWORD) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{user}:{password}@{rest}"


def test_a_gateway_process_never_shows_the_upstream_password() -> None:
    with ServerThread(Simulator(fast_sim())) as sim:
        upstream = _with_credentials(sim.url)
        gateway = ServerProcess("serve", "--upstream", upstream, "--log-level", "debug")
        try:
            body = chat_body(max_tokens=4)
            with httpx2.Client(base_url=gateway.url, timeout=10) as client:
                assert client.post("/v1/chat/completions", json=body).status_code == 200
                plain = {**body, "stream": False}
                assert client.post("/v1/chat/completions", json=plain).status_code == 200
                stats = client.get("/stats").text
                metrics = client.get("/metrics").text
            wait_until(lambda: "".join(gateway.output).count("streamsafe.access") >= 4)
        finally:
            gateway.stop()
    output = "".join(gateway.output)
    assert "upstream http://127.0.0.1" in output  # the probe's line names the engine
    assert f"-> {sim.url} (auto)" in output  # the start line too
    assert f'engine="{sim.url}"' in metrics and sim.url in stats
    for seen in (output, stats, metrics):
        assert PASSWORD not in seen and "gw-user" not in seen


def test_a_pool_names_each_engine_without_its_credentials() -> None:
    with ServerThread(Simulator(fast_sim())) as sim:
        engines = (f"{_with_credentials(sim.url)} models={MODEL}", _with_credentials(sim.url))
        gateway = Gateway(GatewayConfig(upstream=engines[0].split()[0], engines=engines))
        with ServerThread(gateway) as server:
            answer = httpx2.post(
                server.url + "/v1/chat/completions", json=chat_body(max_tokens=3), timeout=10
            )
            stats = str(gateway.stats())
            metrics = httpx2.get(server.url + "/metrics", timeout=10).text
    assert answer.status_code == 200 and sim.url in stats and sim.url in metrics
    assert PASSWORD not in stats + metrics + str(parse_engine(engines[0]))


async def _record_requests(heads: list[bytes]) -> asyncio.Server:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while head := await reader.readuntil(b"\r\n\r\n"):
            heads.append(head)
            length = next(
                (
                    int(v)
                    for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
                    if k.lower() == b"content-length"
                ),
                0,
            )
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


def test_the_password_goes_upstream_as_basic_authorization_on_both_paths() -> None:
    heads: list[bytes] = []

    async def run() -> Upstream:
        server = await _record_requests(heads)
        port = server.sockets[0].getsockname()[1]
        upstream = Upstream(f"http://us%40er:p%3Ass@127.0.0.1:{port}", kind="vllm")
        try:
            await upstream.start()
            stream = await upstream.open_events("/v1/chat/completions", b"{}")
            await stream.head()
            stream.close()
            await upstream.pool.call("GET", "/health")
        finally:
            await upstream.close()
            server.close()
        return upstream

    upstream = asyncio.run(asyncio.wait_for(run(), 20))
    expected = b"authorization: Basic " + base64.b64encode(b"us@er:p:ss")
    assert len(heads) == 2
    assert all(expected in head for head in heads), heads
    assert "p%3Ass" not in upstream.base_url and "@" not in upstream.base_url


def test_an_api_key_wins_over_the_url_credentials() -> None:
    upstream = Upstream("http://u:p@127.0.0.1:9", api_key="k")
    assert upstream.headers["authorization"] == "Bearer k"


@pytest.mark.parametrize(
    ("url", "shown", "userinfo"),
    [
        ("http://u:p@h:1/v1", "http://h:1/v1", "u:p"),
        ("https://token@h", "https://h", "token"),
        ("http://u:p@ss@h/x@y", "http://h/x@y", "u:p@ss"),
        ("http://h:1/a@b?c=d@e", "http://h:1/a@b?c=d@e", None),
        ("redis://:secret@r:6379/0", "redis://r:6379/0", ":secret"),
        ("u:p@h", "h", "u:p"),
    ],
)
def test_split_userinfo_parts_the_credentials_from_the_name(
    url: str, shown: str, userinfo: str | None
) -> None:
    assert split_userinfo(url) == (shown, userinfo)
    assert redact(url) == shown


@given(
    st.text(st.characters(blacklist_characters="/?#@"), min_size=1, max_size=20),
    st.text(st.characters(blacklist_characters="\x00"), max_size=40),
)
def test_no_password_survives_redaction(password: str, tail: str) -> None:
    marked = "\x00" + password  # a password the rest of the URL cannot hold by chance
    url = f"http://user:{marked}@host:8000/{tail}"
    assert marked not in redact(url)
    assert split_userinfo(url)[1] == f"user:{marked}"


def test_an_error_about_a_url_never_repeats_its_password() -> None:
    with pytest.raises(ValueError) as caught:
        GatewayConfig(redis_url=f"http://u:{PASSWORD}@r:6379")
    assert PASSWORD not in str(caught.value)
    with pytest.raises(ValueError) as caught:
        parse_engine(f"ftp://u:{PASSWORD}@h")
    assert PASSWORD not in str(caught.value)
    with pytest.raises(ValueError, match="set one of them"):
        GatewayConfig(upstream=f"http://u:{PASSWORD}@h", forward_authorization=True)
