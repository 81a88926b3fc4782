"""Endpoint rules: which URLs the transport talks to, and which headers it sends.

- no credentials in URLs;
- a scheme, ``http://`` or ``https://``, always written out;
- plain HTTP only to loopback (``localhost`` and ``*.localhost``, ``127.0.0.0/8``,
  ``::1``), HTTPS anywhere; ``localhost`` names are connected to ``127.0.0.1`` and
  ``::1`` only, never looked up (RFC 6761: they are loopback by definition);
- header names and values without line breaks or surrounding whitespace.

::

    check_endpoint("https://api.example.com/")   # "https://api.example.com"
    check_endpoint("http://example.com")         # PiShipError NETWORK_DENIED
    check_endpoint("localhost:3000")             # PiShipError CONFIG_INVALID: no scheme
"""

from __future__ import annotations

import ipaddress
import re
import socket
import urllib.parse
from collections.abc import Mapping
from typing import cast

import requests
import requests.utils

from piship_remote.model.errors import (
    ConfigInvalid,
    NetworkDenied,
    PiShipError,
)

__all__ = ["check_endpoint", "is_localhost_name", "is_loopback", "loopback_addresses"]

AddressInfo = tuple[
    socket.AddressFamily, socket.SocketKind, int, str, tuple[str, int] | tuple[str, int, int, int]
]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_IPV6_LOOPBACK = ipaddress.IPv6Address("::1")
# requests' header rules: no line breaks, no leading whitespace, no ":" in a name.
_HEADER_NAME = re.compile(r"[^:\s][^:\r\n]*\Z")
_HEADER_VALUE = re.compile(r"\S[^\r\n]*\Z|\Z")


def check_endpoint(url: str) -> str:
    """``url`` checked against the endpoint rules, without trailing slashes.

    Raises ``PiShipError`` ``CONFIG_INVALID`` (credentials in the URL, no host) or
    ``NETWORK_DENIED`` (plain HTTP to a non-loopback host, another scheme).
    """
    check_url(url)
    return url.rstrip("/")


def check_url(url: str) -> tuple[str, str]:
    """Apply the endpoint rules to ``url``; returns ``host[:port]`` and the origin."""
    if not isinstance(url, str):
        raise ConfigInvalid(f"Endpoint URL must be a str, not {type(url).__name__}")
    if "://" not in url:
        raise _without_scheme(url)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise ConfigInvalid("Endpoint URL is not a valid URL") from None
    if parts.username is not None or parts.password is not None:
        raise ConfigInvalid("Endpoint URLs must not embed credentials")
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    shown = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        shown = f"{shown}:{port}"
    if scheme != "https" and not (scheme == "http" and is_loopback(host)):
        raise NetworkDenied(
            f"Refusing non-HTTPS endpoint {scheme}://{shown}; "
            "plain HTTP is only allowed for loopback test fixtures",
        )
    if not host:
        raise ConfigInvalid("Endpoint URL has no host")
    return shown, f"{scheme}://{parts.netloc.lower()}"


def _without_scheme(url: str) -> PiShipError:
    """``localhost:3000`` typed for ``http://localhost:3000``: say what to write."""
    typed = url.strip()
    if not typed:
        return ConfigInvalid("Endpoint URL is empty")
    if "@" in typed or len(typed) > 200:
        # What precedes an "@" may be a password: never echo it.
        return ConfigInvalid(
            "Endpoint URL has no scheme",
            user_action="Write the endpoint as https://HOST[:PORT] (or http:// for a service"
            " on this machine), without credentials",
        )
    try:
        local = is_loopback(urllib.parse.urlsplit(f"//{typed}").hostname or "")
    except ValueError:
        local = False
    action = (
        f"Write http://{typed} (a service on this machine), or https://{typed}"
        if local
        else f"Write https://{typed} (plain http:// is only allowed to this machine)"
    )
    return ConfigInvalid(
        f"Endpoint URL {typed!r} has no scheme: write http:// or https:// in front",
        user_action=action,
    )


def is_localhost_name(host: str) -> bool:
    """``localhost`` or a name under it (``49983-sbx.localhost``), any case, a final dot allowed."""
    name = host.lower()
    name = name[:-1] if name.endswith(".") else name
    if name == "localhost":
        return True
    labels = name.split(".")
    return len(labels) > 1 and labels[-1] == "localhost" and all(labels)


def loopback_addresses(host: str, port: int) -> list[AddressInfo] | None:
    """Where a ``localhost`` name is connected: ``127.0.0.1``, then ``::1`` (RFC 6761:
    never asked of a resolver, which could answer otherwise); ``None`` for other hosts."""
    if not is_localhost_name(host):
        return None
    addresses: list[AddressInfo] = [
        (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port))
    ]
    if socket.has_ipv6:
        addresses.append(
            (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("::1", port, 0, 0))
        )
    return addresses


def is_loopback(host: str) -> bool:
    """``localhost`` and ``*.localhost``, ``127.0.0.0/8`` or ``::1``."""
    if is_localhost_name(host):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv4Address):
        return address.is_loopback
    return address == _IPV6_LOOPBACK


def header_is_valid(name: object, value: object) -> bool:
    """requests' header rules (no line breaks, no surrounding whitespace)."""
    if isinstance(name, str) and isinstance(value, str):
        return bool(_HEADER_NAME.match(name) and _HEADER_VALUE.match(value))
    try:
        requests.utils.check_header_validity(cast("tuple[str, str]", (name, value)))
    except requests.exceptions.InvalidHeader:
        return False
    return True


def request_path(prepared: requests.PreparedRequest) -> str:
    """The request line's path; a leading ``//`` collapsed, as requests does, so urllib3
    does not read it as a host."""
    path = prepared.path_url
    return f"/{path.lstrip('/')}" if path.startswith("//") else path


def via_http_proxy(url: str, origin: str, proxies: Mapping[str, str] | None) -> bool:
    """Whether requests to ``url`` go through a plain-HTTP proxy (``request_url``'s rule)."""
    proxy = requests.utils.select_proxy(url, proxies)
    if not proxy or origin.startswith("https:"):
        return False
    return not urllib.parse.urlsplit(proxy).scheme.lower().startswith("socks")
