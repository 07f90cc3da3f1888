"""Host names and addresses, with nothing but the standard library: which names are this machine's
loopback, and the name part of a Host header. A leaf: the weight collective (agentrl.weights.collective)
and the local servers' rules (agentrl.utils.local_only) both use it, and neither pulls the other's
dependencies (torch, aiohttp) through it."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """`host` (a name or an address, brackets allowed) is this machine's loopback: localhost, 127.0.0.0/8, ::1."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    """A bind to every interface (0.0.0.0, ::, or no address at all)."""
    return host in ("", "0.0.0.0", "::", "[::]")


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name part of a Host header (or an Origin's netloc): port and IPv6 brackets gone, lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    if header.count(":") == 1:  # name:port; a bare IPv6 address has several colons and no port
        return header.partition(":")[0]
    return header
