"""Forwarded headers, believed only from the reverse proxies the admin lists (``server.trusted_proxies``).

A proxy tells the app who the client is (``X-Forwarded-For``), which scheme it used (``X-Forwarded-Proto``) and
which name it asked for (``X-Forwarded-Host``). Anyone else can send the same headers, so they count only when
the TCP peer is a listed proxy: then the client address and scheme are taken from them (for the sign-in
throttle, the rate limit and everything after); from any other peer they are removed before the app sees the
request, so no later code (ours or Gradio's) can be fooled by them. uvicorn's own handling is switched off
(``ui.webapp.serve``): it believes any loopback peer, which a web page on this machine can be.
"""
from __future__ import annotations

import ipaddress
from typing import Optional

from rlhf.config import ConfigError

# Headers through which a client can claim another address, scheme or host.
FORWARDED_HEADERS = frozenset({b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host", b"x-forwarded-port",
                               b"x-real-ip", b"forwarded"})
ANY = "*"


class TrustedProxies:
    """The proxies of ``server.trusted_proxies``: addresses or networks (CIDR), or '*' for any peer."""

    def __init__(self, entries: list[str]):
        self.any = False
        self.networks = []
        for entry in (str(e).strip() for e in entries):
            if entry == ANY:
                self.any = True
                continue
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                raise ConfigError(f"server.trusted_proxies: expected an IP address, a network (CIDR) or '*', "
                                  f"got {entry!r}") from None

    def __bool__(self) -> bool:
        return self.any or bool(self.networks)

    def trusts(self, address: Optional[str]) -> bool:
        """True when ``address`` is a listed proxy."""
        if not address:
            return False
        if self.any:
            return True
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False  # not an address at all (an in-process client's name)
        return any(ip in net for net in self.networks)

    def client(self, peer: str, forwarded_for: str) -> str:
        """The client behind ``peer``: X-Forwarded-For read from the right (the nearest proxy appends last), the
        first entry that is not itself a listed proxy; with '*' the rightmost entry (what the proxy saw)."""
        hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
        if not hops:
            return peer
        if self.any:
            return hops[-1]
        return next((h for h in reversed(hops) if not self.trusts(h)), hops[0])


def _joined(headers: list, name: bytes) -> str:
    values = [v.decode("latin-1") for k, v in headers if k.lower() == name]
    return ",".join(values)


class ForwardedHeaders:
    """Pure ASGI middleware, outermost: apply forwarded headers from a trusted proxy, drop them from anyone else."""

    def __init__(self, app, proxies: TrustedProxies):
        self.app = app
        self.proxies = proxies

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = scope.get("headers") or []
        peer = (scope.get("client") or (None, 0))[0]
        scope = dict(scope)
        if self.proxies.trusts(peer):
            forwarded_for = _joined(headers, b"x-forwarded-for")
            if forwarded_for.strip():
                scope["client"] = (self.proxies.client(peer, forwarded_for), 0)
            proto = _joined(headers, b"x-forwarded-proto").split(",")[-1].strip().lower()
            if proto in ("http", "https"):
                secure = proto == "https"
                scope["scheme"] = ("wss" if secure else "ws") if scope["type"] == "websocket" else proto
        else:
            scope["headers"] = [(k, v) for k, v in headers if k.lower() not in FORWARDED_HEADERS]
        return await self.app(scope, receive, send)
