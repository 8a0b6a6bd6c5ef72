"""Where the gateway replicas' Redis is, from one URL: a pure parser, so a URL that cannot be
used is one line at start (its password never shown), and what it names is a value.

The forms (the userinfo, ``[user][:password]@``, is the data nodes' AUTH; any form takes
``?db=N``):

- ``redis://host[:port][/db]``: one Redis (port 6379 by default);
- ``rediss://host[:port][/db]``: the same over TLS, verified against the system's CAs or
  ``?ssl_ca_certs=FILE`` (or ``--redis-ca-certs``); ``ssl_certfile`` and ``ssl_keyfile`` for a
  client certificate, ``ssl_cert_reqs=none|optional|required`` and
  ``ssl_check_hostname=true|false`` as redis-py names them;
- ``unix:///path/to.sock[?db=N]``: a local socket;
- ``redis+sentinel://host:port[,host:port...]/service[/db]`` (``rediss+sentinel://``: TLS to
  the sentinels and the primary): the primary Redis Sentinel names for ``service``, found again
  after a failover (port 26379 by default);
- ``redis+cluster://host:port[,host:port...][/0]`` (``rediss+cluster://``: TLS to every node): a
  Redis Cluster, whose layout the client learns from the first of these nodes that answers (port
  6379 by default; a cluster has one database, 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qsl, unquote

from streamsafe._url_userinfo import redact, split_userinfo

__all__ = ["RedisTarget", "parse_redis_url"]

_DIRECT = {"redis": False, "rediss": True}
_SENTINEL = {"redis+sentinel": False, "rediss+sentinel": True}
_CLUSTER = {"redis+cluster": False, "rediss+cluster": True}
_TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_CERT_REQS = ("none", "optional", "required")
_BOOLS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


@dataclass(frozen=True)
class RedisTarget:
    """A parsed Redis URL: what to connect to, and the name it is shown by."""

    #: The URL without its credentials: what logs and errors show.
    name: str
    #: Keyword arguments of a redis-py client of the data node (``host``, ``port`` or
    #: ``unix_socket_path``, ``db``, ``username``, ``password``, ``ssl`` and its options);
    #: with sentinels, everything but where the primary is.
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    #: The sentinels asked where the primary is (empty: ``options`` name the node).
    sentinels: tuple[tuple[str, int], ...] = ()
    #: The service (``master`` name) the sentinels watch; ``None`` without sentinels.
    service: str | None = None
    #: The nodes a Redis Cluster client starts from (empty: not a cluster; ``options`` then
    #: hold everything but where the nodes are).
    cluster: tuple[tuple[str, int], ...] = ()

    @property
    def tls(self) -> bool:
        """Whether the connections are TLS."""
        return bool(self.options.get("ssl"))


def parse_redis_url(url: str, *, ca_certs: str | None = None) -> RedisTarget:
    """The :class:`RedisTarget` ``url`` names (see the module); ``ca_certs``: the CA file a
    TLS URL is verified against where it names none. A URL that cannot be used raises
    ``ValueError``, whose message shows the URL without its credentials."""
    name = redact(url.strip())
    try:
        return _parse(url.strip(), name, ca_certs)
    except ValueError as exc:
        raise ValueError(f"--redis {name!r}: {exc}") from None


def _parse(url: str, name: str, ca_certs: str | None) -> RedisTarget:
    rest, userinfo = split_userinfo(url)
    scheme, sep, rest = rest.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise ValueError("not a URL; expected redis://host:port/db (or rediss://, unix://, "
                         "redis+sentinel://, redis+cluster://)")  # fmt: skip
    rest, _, fragment = rest.partition("#")
    if fragment:
        raise ValueError("a fragment (#...) means nothing here")
    location, _, query = rest.partition("?")
    authority, slash, path = location.partition("/")
    options: dict[str, Any] = _credentials(userinfo)
    options.update(_query(query))
    sentinels: tuple[tuple[str, int], ...] = ()
    cluster: tuple[tuple[str, int], ...] = ()
    service = None
    if scheme == "unix":
        if authority or not slash or not path.strip("/"):
            raise ValueError("expected unix:///path/to.sock")
        options["unix_socket_path"] = "/" + path
        tls = False
    elif scheme in _DIRECT:
        tls = _DIRECT[scheme]
        options["host"], options["port"] = _address(authority, 6379)
        if path:
            options["db"] = _db(path, options.get("db"))
    elif scheme in _SENTINEL:
        tls = _SENTINEL[scheme]
        sentinels = tuple(_address(part, 26379) for part in authority.split(","))
        service, _, db = path.partition("/")
        if not service:
            raise ValueError("expected redis+sentinel://host:port[,host:port]/service[/db]")
        service = unquote(service)
        if db:
            options["db"] = _db(db, options.get("db"))
    elif scheme in _CLUSTER:
        tls = _CLUSTER[scheme]
        cluster = tuple(_address(part, 6379) for part in authority.split(","))
        if (path and _db(path, None) != 0) or options.get("db", 0) != 0:
            raise ValueError("a Redis Cluster has one database, 0")
        options.pop("db", None)
    else:
        raise ValueError(f"unknown scheme {scheme!r}; expected redis, rediss, unix, "
                         "redis+sentinel or redis+cluster")  # fmt: skip
    if tls:
        options["ssl"] = True
        if ca_certs is not None and "ssl_ca_certs" not in options:
            options["ssl_ca_certs"] = ca_certs
    else:
        given = [k for k in (*_TLS_OPTIONS, "ssl_cert_reqs", "ssl_check_hostname") if k in options]
        if given or ca_certs is not None:
            what = ", ".join(given) or "--redis-ca-certs"
            raise ValueError(f"{what} wants TLS: a rediss:// URL")
    return RedisTarget(name, MappingProxyType(options), sentinels, service, cluster)


def _credentials(userinfo: str | None) -> dict[str, Any]:
    if userinfo is None:
        return {}
    user, colon, password = userinfo.partition(":")
    found: dict[str, Any] = {}
    if user:
        found["username"] = unquote(user)
    if colon and password:
        found["password"] = unquote(password)
    elif user and not colon:  # redis://secret@host: a password alone, as redis-cli reads it
        found = {"password": unquote(user)}
    return found


def _query(query: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError("a query that is not name=value&...") from None
    for key, value in pairs:
        if key in found:
            raise ValueError(f"{key} given twice")
        if key == "db":
            found["db"] = _db(value, None)
        elif key in _TLS_OPTIONS:
            if not value:
                raise ValueError(f"{key} wants a file")
            found[key] = value
        elif key == "ssl_cert_reqs":
            if value.lower() not in _CERT_REQS:
                raise ValueError(f"ssl_cert_reqs is one of {', '.join(_CERT_REQS)}")
            found[key] = value.lower()
        elif key == "ssl_check_hostname":
            if value.lower() not in _BOOLS:
                raise ValueError("ssl_check_hostname is true or false")
            found[key] = _BOOLS[value.lower()]
        else:
            known = ", ".join(("db", *_TLS_OPTIONS, "ssl_cert_reqs", "ssl_check_hostname"))
            raise ValueError(f"unknown option {key[:40]!r} (known: {known})")
    return found


def _address(authority: str, default_port: int) -> tuple[str, int]:
    """``host[:port]`` (``[v6]:port`` for an IPv6 address) as ``(host, port)``."""
    if authority.startswith("["):
        host, bracket, after = authority[1:].partition("]")
        if not bracket or not host or (after and not after.startswith(":")):
            raise ValueError(f"a bad address {authority[:60]!r}")
        port = after[1:] if after else ""
    else:
        host, _, port = authority.partition(":")
        if ":" in port:
            raise ValueError(f"an IPv6 address goes in brackets: [{authority[:60]}]")
    if not host:
        raise ValueError("no host")
    if any(c.isspace() or c in "@/?#[]" for c in host):
        raise ValueError(f"a bad host {host[:60]!r}")
    if not port:
        return host, default_port
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"port {port[:20]!r} is not one from 1 to 65535")
    return host, int(port)


def _db(text: str, already: int | None) -> int:
    text = text.strip("/")
    if not (text.isascii() and text.isdigit()) or len(text) > 5:
        raise ValueError(f"database {text[:20]!r} is not a number")
    if already is not None and already != int(text):
        raise ValueError("two databases (the path and ?db=)")
    return int(text)
