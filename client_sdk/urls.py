"""The device's one rule for a server URL: https, or plain http on loopback only.

:class:`~client_sdk.client.TelemetryClient` (``collector_url`` and
``issuer_url``) and :class:`~client_sdk.fl.device.FLDevice` (``collector_url``)
check their URLs here, so the rule and its message are the same everywhere a
device talks to a server. Plain http off loopback would let anyone on the path
read (and change) what the device sends and receives.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from typing import Any

from ldp_core.errors import LDPError

__all__ = ["ClientConfigError", "check_url", "is_loopback"]


class ClientConfigError(LDPError, ValueError):
    """The client was configured wrongly; the message says how to fix it."""


def check_url(url: Any, what: str = "collector_url") -> str:
    """``url`` without a trailing slash, or :class:`ClientConfigError` if it is not an http(s) URL with a
    host and no query, or if it is plain http to a host other than loopback."""
    if not isinstance(url, str):
        raise ClientConfigError(f"{what} must be a string such as 'https://collector.example.org', got {url!r}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ClientConfigError(f"{what} {url!r} must be an http(s) URL with a host and no query")
    if parts.scheme == "http" and not is_loopback(parts.hostname or ""):
        raise ClientConfigError(
            f"{what} {url!r} is plain http: what the device sends would cross the network unencrypted; "
            "use https:// (plain http is accepted only on loopback, e.g. http://127.0.0.1:8080 in development)"
        )
    return url.rstrip("/")


def is_loopback(host: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1 (a name that only resolves to loopback is not trusted to)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
