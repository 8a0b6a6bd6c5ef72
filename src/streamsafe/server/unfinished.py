"""How many connections each client address holds with a request still arriving: the bound
(``ServerLimits.max_unfinished_per_client``) that keeps a few addresses trickling requests
from taking every connection a server may hold.

A connection that has not yet sent a whole request costs the server a place under its
connection cap and nothing else: the header and body timeouts bound how long one may take, but
thirty of them, each renewed as it is cut, would hold a thirty-connection server. Bounded per
address, they leave the rest of the cap to everyone else.
"""

from __future__ import annotations

import ipaddress

__all__ = ["UnfinishedRequests", "client_key"]


def client_key(host: str) -> str:
    """The address a client at ``host`` is counted under: its IPv4 address (an IPv4-mapped IPv6
    one included), or the /64 network its IPv6 address is in, as one host is usually given a
    whole /64 and could otherwise count as many clients as it likes."""
    if ":" not in host:
        return host
    try:
        ip = ipaddress.IPv6Address(host.partition("%")[0])
    except ValueError:
        return host
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((ip, 64), strict=False))


class UnfinishedRequests:
    """The connections of each client address with a request still arriving, bounded by
    ``bound`` per address (``None``: counted, never refused). One per server: its connections
    call :meth:`begin` when a request is owed and :meth:`end` once it is whole (or the
    connection is answered, or gone)."""

    __slots__ = ("bound", "by_address")

    def __init__(self, bound: int | None) -> None:
        self.bound = bound
        self.by_address: dict[str, int] = {}

    def begin(self, address: str) -> bool:
        """Count a connection of ``address`` owing a request; ``False`` (not counted) where the
        address already holds ``bound`` of them."""
        held = self.by_address.get(address, 0)
        if self.bound is not None and held >= self.bound:
            return False
        self.by_address[address] = held + 1
        return True

    def end(self, address: str) -> None:
        """A connection counted by :meth:`begin` no longer owes its request."""
        held = self.by_address.get(address, 0) - 1
        if held > 0:
            self.by_address[address] = held
        else:  # an address with nothing owed takes no room: the map holds only those that do
            self.by_address.pop(address, None)
