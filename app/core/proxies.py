"""Which address a request comes from: the peer, unless the peer is a proxy named in
MOERAG_TRUSTED_PROXIES, whose `X-Forwarded-For` then says (rightmost address not itself a
trusted proxy, as uvicorn's `forwarded_allow_ips` reads it).

Nothing is trusted by default: any local process, or anything forwarding TCP to the port
(ssh -L, kubectl port-forward, haproxy in tcp mode), could otherwise pick its own address and a
rate-limit bucket of its own with one header.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from starlette.requests import HTTPConnection

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=8)
def parse_trusted(spec: str) -> tuple[Network, ...] | None:
    """Comma-separated addresses and networks (`127.0.0.1, 10.0.0.0/8`); None for `*` (every peer).
    Raises ValueError naming an entry that is neither."""
    entries = [e.strip() for e in spec.split(",") if e.strip()]
    if "*" in entries:
        return None
    nets = []
    for entry in entries:
        try:
            nets.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"MOERAG_TRUSTED_PROXIES: {entry!r} is not an address or a network") from None
    return tuple(nets)


def _trusted(address: str, nets: tuple[Network, ...] | None) -> bool:
    if nets is None:
        return True
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in nets)


def client_address(conn: HTTPConnection, trusted: str) -> str:
    """The client's address: the peer's, or what a trusted proxy peer forwarded."""
    peer = conn.client.host if conn.client else ""
    if not trusted.strip() or not _trusted(peer, nets := parse_trusted(trusted)):
        return peer
    hops = [h.strip() for h in ",".join(conn.headers.getlist("x-forwarded-for")).split(",") if h.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, nets):
            return hop
    return hops[0] if hops else peer
