"""The ``--redis`` URL parser (:mod:`streamsafe._redis_url`): every form it takes, what it
refuses with one line, and that no password is ever in what it shows."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from streamsafe._redis_url import parse_redis_url
from streamsafe.cli import main
from streamsafe.gateway.config import GatewayConfig

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_a_plain_url_names_host_port_and_database() -> None:
    target = parse_redis_url("redis://10.0.0.9:6380/2")
    assert dict(target.options) == {"host": "10.0.0.9", "port": 6380, "db": 2}
    assert not target.sentinels and not target.tls
    assert dict(parse_redis_url("redis://cache").options) == {"host": "cache", "port": 6379}
    assert parse_redis_url("redis://[::1]:7000?db=3").options["host"] == "::1"


def test_credentials_go_to_the_connection_and_never_into_the_name() -> None:
    target = parse_redis_url("redis://app:p%40ss@cache:6379/0")
    assert target.options["username"] == "app" and target.options["password"] == "p@ss"
    assert target.name == "redis://cache:6379/0"
    # A password alone, as redis-cli reads redis://:secret@ and redis://secret@.
    assert parse_redis_url("redis://:s3@cache").options["password"] == "s3"
    assert "username" not in parse_redis_url("redis://:s3@cache").options


def test_rediss_is_tls_with_the_ca_of_the_url_or_of_the_option() -> None:
    target = parse_redis_url("rediss://cache:6380/0?ssl_ca_certs=/etc/ca.pem")
    assert target.tls and target.options["ssl_ca_certs"] == "/etc/ca.pem"
    assert (
        parse_redis_url("rediss://cache", ca_certs="/ca.pem").options["ssl_ca_certs"] == "/ca.pem"
    )
    strict = parse_redis_url("rediss://c?ssl_cert_reqs=Required&ssl_check_hostname=false")
    assert strict.options["ssl_cert_reqs"] == "required"
    assert strict.options["ssl_check_hostname"] is False


def test_a_unix_socket_takes_its_database_in_the_query() -> None:
    target = parse_redis_url("unix:///run/redis/redis.sock?db=4")
    assert dict(target.options) == {"unix_socket_path": "/run/redis/redis.sock", "db": 4}


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_database() -> None:
    target = parse_redis_url("redis+sentinel://:pw@s1:26379,s2,[::1]:26380/mymaster/1")
    assert target.sentinels == (("s1", 26379), ("s2", 26379), ("::1", 26380))
    assert target.service == "mymaster"
    assert dict(target.options) == {"password": "pw", "db": 1}
    assert target.name == "redis+sentinel://s1:26379,s2,[::1]:26380/mymaster/1"
    assert parse_redis_url("rediss+sentinel://s1/m").tls


def test_a_cluster_url_names_the_nodes_to_start_from_and_no_database() -> None:
    target = parse_redis_url("redis+cluster://:pw@n1:7000,n2,[::1]:7002/0")
    assert target.cluster == (("n1", 7000), ("n2", 6379), ("::1", 7002))
    assert dict(target.options) == {"password": "pw"}  # no db: a cluster has database 0 only
    assert target.name == "redis+cluster://n1:7000,n2,[::1]:7002/0"
    assert not target.sentinels and target.service is None and not target.tls
    tls = parse_redis_url("rediss+cluster://n1:7000", ca_certs="/ca.pem")
    assert tls.tls and tls.options["ssl_ca_certs"] == "/ca.pem"
    assert not parse_redis_url("redis://cache").cluster


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://cache:6379", "unknown scheme 'http'"),
        ("cache:6379", "not a URL"),
        ("redis://:6379/0", "no host"),
        ("redis://cache:99999", "port '99999' is not one from 1 to 65535"),
        ("redis://cache:6x", "port '6x'"),
        ("redis://cache/zero", "database 'zero' is not a number"),
        ("redis://cache/1?db=2", "two databases"),
        ("redis://cache?timeout=3", "unknown option 'timeout'"),
        ("redis://cache?db=1&db=1", "db given twice"),
        ("redis://cache?ssl_ca_certs=/ca.pem", "ssl_ca_certs wants TLS: a rediss:// URL"),
        ("rediss://cache?ssl_cert_reqs=maybe", "ssl_cert_reqs is one of"),
        ("unix://host/sock", "expected unix:///path/to.sock"),
        ("redis+sentinel://s1:26379", "expected redis+sentinel://"),
        ("redis+sentinel://s1:26379,/m", "no host"),
        ("redis://::1:6379", "an IPv6 address goes in brackets"),
        ("redis://cache#x", "a fragment"),
        ("redis+cluster://a:7000/1", "a Redis Cluster has one database, 0"),
        ("redis+cluster://a:7000?db=2", "a Redis Cluster has one database, 0"),
        ("redis+cluster://a:7000,", "no host"),
        ("redis+cluster://a:7000?ssl_certfile=/c.pem", "ssl_certfile wants TLS"),
    ],
)
def test_a_url_that_cannot_be_used_is_refused_with_why(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=r"^--redis ") as caught:
        parse_redis_url(url)
    assert says in str(caught.value)


def test_the_ca_option_wants_a_tls_url() -> None:
    with pytest.raises(ValueError, match="--redis-ca-certs wants TLS"):
        parse_redis_url("redis://cache", ca_certs="/ca.pem")


# A password starts with a mark no message holds, so finding it there is a leak, not a chance.
_SECRET = st.text(st.characters(codec="ascii", exclude_characters="\x00%"), min_size=2).map(
    lambda s: "Zq9!" + s.strip()
)
_HOST = st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z0-9-]{1,10}){0,2}", fullmatch=True)


def _quoted(secret: str) -> str:
    from urllib.parse import quote

    return quote(secret, safe="")


@given(
    scheme=st.sampled_from(
        ["redis", "rediss", "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster"]
    ),
    hosts=st.lists(st.tuples(_HOST, st.integers(1, 65535)), min_size=1, max_size=3),
    password=_SECRET,
    db=st.integers(0, 15),
)
def test_any_url_round_trips_and_its_password_is_never_shown(
    scheme: str, hosts: list[tuple[str, int]], password: str, db: int
) -> None:
    sentinel, cluster = "sentinel" in scheme, "cluster" in scheme
    hosts = hosts if sentinel or cluster else hosts[:1]
    db = 0 if cluster else db
    authority = ",".join(f"{h}:{p}" for h, p in hosts)
    path = f"/svc/{db}" if sentinel else f"/{db}"
    url = f"{scheme}://:{_quoted(password)}@{authority}{path}"
    target = parse_redis_url(url)
    assert target.options["password"] == password
    assert target.options.get("db", 0) == db
    assert password not in target.name and _quoted(password) not in target.name
    if sentinel:
        assert target.sentinels == tuple(hosts) and target.service == "svc"
    elif cluster:
        assert target.cluster == tuple(hosts) and "db" not in target.options
    else:
        assert (target.options["host"], target.options["port"]) == hosts[0]
    assert target.tls == scheme.startswith("rediss")


@given(
    scheme=st.sampled_from(["redis", "redis+sentinel", "rediss+cluster"]),
    junk=st.text(max_size=40),
    password=_SECRET,
)
def test_a_refusal_never_repeats_the_password(scheme: str, junk: str, password: str) -> None:
    assume("Zq9!" not in junk)
    url = f"{scheme}://:{_quoted(password)}@{junk}"
    try:
        parse_redis_url(url)
    except ValueError as exc:
        assert password not in str(exc) and _quoted(password) not in str(exc)


def test_the_gateway_config_and_the_command_line_refuse_a_bad_url_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(ValueError, match="a Redis Cluster has one database, 0") as caught:
        GatewayConfig(upstream="http://e", redis_url="redis+cluster://:pw@a:7000/3")
    assert "pw" not in str(caught.value)
    argv = ["serve", "--upstream", "http://127.0.0.1:1", "--redis", "redis://:hunter2@cache:0"]
    assert main(argv) == 2
    out = capsys.readouterr()
    said = (out.out + out.err).strip()
    assert said.count("\n") == 0 and "port '0' is not one from 1 to 65535" in said, said
    assert "hunter2" not in said
