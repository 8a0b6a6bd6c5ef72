"""A client that stops reading holds nothing for longer than the server's send timeout (issue 23,
row 10): 10 such clients kept their connections, subscribers and generations' logs, outside
``--max-kept-mb``, 45 s after retention had dropped them."""

from __future__ import annotations

import socket

import orjson
from gateway_helpers import chat_body, fast_sim, wait_for

from server_stops import stop_later
from streamsafe.engine_sim import Simulator
from streamsafe.gateway import Gateway, GatewayConfig
from streamsafe.server import ServerLimits, ServerThread


def test_a_subscriber_whose_client_stopped_reading_leaves_after_the_send_timeout() -> None:
    sim = Simulator(fast_sim(itl_ms=0.2, memory_tokens=10**6))
    sim_server = ServerThread(sim).start()
    gw = Gateway(GatewayConfig(upstream=sim_server.url, grace=0.0, heartbeat=0.05))
    server = ServerThread(gw, limits=ServerLimits(send_timeout=0.5)).start()
    try:
        readers = []
        for i in range(3):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting
            sock.connect((server.host, server.port))
            body = orjson.dumps(chat_body(f"never read {i}", max_tokens=20_000))
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            readers.append(sock)  # and never read from
        wait_for(lambda: gw.stats()["generations_started"] == 3, what="three streams")
        # Their sockets back up within a fraction of a second; half a second later each is
        # reset, its subscriber leaves, and (grace 0) its generation is aborted and let go.
        wait_for(lambda: gw.stats()["subscribers"] == 0, timeout=20, what="subscribers gone")
        wait_for(lambda: gw.stats()["generations_aborted"] == 3, timeout=20, what="aborted")
        assert gw.stats()["live_generations"] == 0
        for sock in readers:
            sock.close()
    finally:
        stop_later(server, sim_server)
