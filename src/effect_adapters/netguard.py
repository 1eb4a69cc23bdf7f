"""Outbound HTTP that only connects to addresses a destination may reach (SSRF guard).

The check happens where the socket is opened, on the address actually connected: the host
of every connection (the webhook URL, its status URL) is resolved here, every resolved
address is checked, and the connection goes to a checked IP — never to a name resolved again
later (no DNS-rebinding window). TLS still verifies the certificate for the URL's host name
(SNI) and the ``Host`` header is the URL's, because only the TCP connect is redirected to the
IP. Proxies from the environment are ignored (a proxy would connect on our behalf, unchecked).

Refused unless the destination sets ``allow_private``: loopback, private (RFC 1918, ULA),
link-local, carrier-grade NAT, unspecified, multicast, reserved and every other non-global
address. An IPv6 address that carries an IPv4 address is judged by the IPv4 address it
carries, because that is where the packets end up: IPv4-mapped (``::ffff:a.b.c.d``),
IPv4-translated (``::ffff:0:a.b.c.d``), IPv4-compatible (``::a.b.c.d``), NAT64
(``64:ff9b::a.b.c.d``) and 6to4 (``2002:AABB:CCDD::``). Teredo tunnel addresses
(``2001::/32``) are refused (the metadata check reads the client address they carry). The
local-use NAT64 prefix (``64:ff9b:1::/48``) is refused outright: where it embeds the IPv4
address depends on the operator's prefix length, so it cannot be judged. Cloud metadata
endpoints are refused even with ``allow_private``, in every one of these spellings.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

from chronolog.destinations import embedded_ipv4
from chronolog.wakeup import wait_within

METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254"))

_LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215: embedding not knowable

AnyAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class BlockedAddress(Exception):
    """The destination resolved to an address it may not reach; nothing was sent."""


def _non_public(ip: AnyAddress) -> bool:
    return ip.is_multicast or ip.is_unspecified or not ip.is_global


def address_refusal(ip: AnyAddress, allow_private: bool) -> str | None:
    """Why a connection to ``ip`` is refused, or None."""
    carried = embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
    if ip in METADATA_ADDRESSES or carried in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if allow_private:
        return None
    if ip in _LOCAL_NAT64:
        return "a local-use NAT64 address (the IPv4 address it reaches cannot be judged)"
    if isinstance(ip, ipaddress.IPv6Address) and ip.teredo is not None:
        return "a Teredo tunnel address (not a public address)"
    if carried is not None:
        if _non_public(carried):
            return f"not a public address (it carries {carried}: loopback, private or reserved)"
        return None
    if _non_public(ip):
        return "not a public address (loopback, private, link-local or reserved)"
    return None


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """An httpcore network backend that resolves, checks, then connects to the IP."""

    def __init__(self, allow_private: bool) -> None:
        self.allow_private = allow_private
        self._inner = httpcore.AnyIOBackend()

    async def _resolve(self, host: str, port: int, timeout: float | None) -> list[str]:
        try:
            return [str(ipaddress.ip_address(host.strip("[]")))]
        except ValueError:
            pass
        loop = asyncio.get_running_loop()
        try:
            infos = await wait_within(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout)
        except (TimeoutError, OSError) as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        return list(dict.fromkeys(str(info[4][0]) for info in infos))

    async def connect_tcp(
        self, host: str, port: int, timeout: float | None = None,
        local_address: str | None = None, socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await self._resolve(host, port, timeout)
        for addr in addresses:  # one refused answer refuses the name: no mixed answers
            why = address_refusal(ipaddress.ip_address(addr.split("%")[0]), self.allow_private)
            if why is not None:
                raise BlockedAddress(f"{host} is {addr}, {why}" if addr != host
                                     else f"{addr} is {why}")
        last: Exception | None = None
        for addr in addresses:
            try:
                return await self._inner.connect_tcp(
                    addr, port, timeout=timeout, local_address=local_address,
                    socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None
                                  ) -> httpcore.AsyncNetworkStream:
        raise BlockedAddress("unix sockets are not reachable by effects")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class GuardedTransport(httpx.AsyncHTTPTransport):
    """``httpx.AsyncHTTPTransport`` whose connection pool uses ``GuardedBackend``."""

    def __init__(self, allow_private: bool) -> None:
        super().__init__(trust_env=False)
        # the parent builds its pool without a network backend hook: build the same pool
        # (defaults of httpx) over the guarded backend
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0,
            network_backend=GuardedBackend(allow_private),
        )


def guarded_client(allow_private: bool) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` that never follows redirects and connects only where allowed."""
    return httpx.AsyncClient(transport=GuardedTransport(allow_private), follow_redirects=False,
                             trust_env=False)
