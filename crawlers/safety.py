"""Which addresses the crawler may connect to, enforced after DNS resolution.

Why: a crawled page can link or redirect to ``http://169.254.169.254/`` or to a name that resolves
to ``10.0.0.5``; following it would let the web reach the crawler's own network (SSRF). The check
runs inside the connector's resolver, so it applies to every connection, every redirect hop and
every retry, and to IP literals before any request is made.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Mapping

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class BlockedAddress(OSError):
    """The host resolves only to addresses the policy forbids (private, loopback, metadata...)."""


class AddressPolicy:
    """Allows public unicast addresses; everything else only through the explicit allow-list."""

    def __init__(self, allow_networks: Iterable[str] = (), allow_private: bool = False) -> None:
        self.allow_private = allow_private
        self.allow_networks: tuple[IPNetwork, ...] = tuple(
            ipaddress.ip_network(net, strict=False) for net in allow_networks
        )

    def allows(self, address: str) -> bool:
        """True if a connection to ``address`` (an IP literal) is permitted."""
        try:
            ip: IPAddress = ipaddress.ip_address(address.strip("[]").split("%")[0])
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in net for net in self.allow_networks):
            return True
        if ip.is_multicast or ip.is_unspecified:
            return False
        return self.allow_private or ip.is_global

    def check_literal(self, host: str) -> None:
        """Raise :class:`BlockedAddress` if ``host`` is an IP literal the policy forbids."""
        try:
            ipaddress.ip_address(host.strip("[]").split("%")[0])
        except ValueError:
            return
        if not self.allows(host):
            raise BlockedAddress(f"address {host} is private, loopback, link-local or reserved")


class GuardedResolver(AbstractResolver):
    """Resolves through a static host map (tests, ``--resolve``) or DNS, then filters by policy."""

    def __init__(self, policy: AddressPolicy, host_map: Mapping[str, str] | None = None,
                 inner: AbstractResolver | None = None) -> None:
        self.policy = policy
        self.host_map = {name.lower().rstrip("."): ip for name, ip in (host_map or {}).items()}
        self._inner = inner

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        name = host.lower().rstrip(".")
        if name in self.host_map:
            ip = self.host_map[name]
            infos: list[ResolveResult] = [{
                "hostname": host, "host": ip, "port": port,
                "family": socket.AF_INET6 if ":" in ip else socket.AF_INET,
                "proto": 0, "flags": socket.AI_NUMERICHOST,
            }]
        else:
            if self._inner is None:
                self._inner = DefaultResolver()
            infos = await self._inner.resolve(host, port, family)
        allowed = [info for info in infos if self.policy.allows(info["host"])]
        if not allowed:
            addresses = ", ".join(sorted({info["host"] for info in infos})) or "nothing"
            raise BlockedAddress(f"{host} resolves to {addresses}: private, loopback, link-local or "
                                 "reserved addresses are not crawled (see allow_networks)")
        return allowed

    async def close(self) -> None:
        if self._inner is not None:
            await self._inner.close()


def blocked_cause(exc: BaseException) -> BlockedAddress | None:
    """The :class:`BlockedAddress` behind an aiohttp connection error, if that is what it was."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, BlockedAddress):
            return current
        seen.add(id(current))
        nested = getattr(current, "os_error", None)
        current = nested if isinstance(nested, BaseException) and id(nested) not in seen else (
            current.__cause__ or current.__context__)
    return None
