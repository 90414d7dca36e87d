"""Client sources: the unit that registration caps, lease fair share and probation are counted by.

Keys are free to mint, addresses are not: a *source* is a client's address cut to its network
prefix (``sources.ipv4_prefix`` / ``sources.ipv6_prefix``, a /24 and a /64 by default), so every
identity a host or a small network registers is one source, however many keys it signs with.
Addresses in the operator's allow-list (``sources.allow``) are trusted machines: each of their
keys is a source of its own and is never on probation. Pure: no sockets, no database.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import TypeVar

from coordinator.config import SourcesConfig

T = TypeVar("T")

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(networks: list[str]) -> tuple[IpNetwork, ...]:
    """CIDR strings (or bare addresses) as networks; the config has already checked that they parse."""
    return tuple(ipaddress.ip_network(network, strict=False) for network in networks)


MAX_REMEMBERED = 1 << 16
"""Addresses whose answers a :class:`SourcePolicy` keeps."""


MAX_ADDRESS_CHARS = 45
"""The longest textual IP address (an IPv6 address with an IPv4 tail); longer names are answered, not remembered."""


def _remembered(answers: dict[str, T], address: str, answer: Callable[[str], T]) -> T:
    found = answers.get(address)
    if found is None:
        found = answer(address)
        if len(address) <= MAX_ADDRESS_CHARS:  # a forwarded header can name anything: keep only what fits an IP
            if len(answers) >= MAX_REMEMBERED:
                answers.clear()
            answers[address] = found
    return found


class SourcePolicy:
    """Which source an address belongs to, and whether the operator trusts it (see the module docstring)."""

    def __init__(self, config: SourcesConfig) -> None:
        self.ipv4_prefix = config.ipv4_prefix
        self.ipv6_prefix = config.ipv6_prefix
        self.allow = parse_networks(config.allow)
        # Every request asks about its node's address, and a lease about every live worker's once a second:
        # the answers by address, forgotten all at once when too many
        self._prefixes: dict[str, str] = {}
        self._allowed: dict[str, bool] = {}

    def prefix(self, address: str) -> str:
        """The network prefix of ``address`` (e.g. ``203.0.113.0/24``); a non-IP peer name stands for itself."""
        return _remembered(self._prefixes, address, self._prefix)

    def is_allowed(self, address: str) -> bool:
        """True when the operator listed ``address`` in ``sources.allow``."""
        return _remembered(self._allowed, address, self._is_allowed)

    def _prefix(self, address: str) -> str:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return address
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # ::ffff:a.b.c.d is the IPv4 client a.b.c.d on a dual-stack socket
        bits = self.ipv4_prefix if ip.version == 4 else self.ipv6_prefix
        return str(ipaddress.ip_network(f"{ip}/{bits}", strict=False))

    def _is_allowed(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in network for network in self.allow)

    def source_of(self, node_id: str, address: str) -> str:
        """The source a node's leases count against: its own key when allow-listed, else its address's prefix."""
        return f"node:{node_id}" if self.is_allowed(address) else self.prefix(address)
