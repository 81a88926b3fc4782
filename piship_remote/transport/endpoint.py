"""Endpoint rules: which URLs the transport talks to, and which headers it sends.

- no credentials in URLs;
- plain HTTP only to loopback (``localhost``, ``127.0.0.0/8``, ``::1``), HTTPS anywhere;
- header names and values without line breaks or surrounding whitespace.

::

    check_endpoint("https://api.example.com/")   # "https://api.example.com"
    check_endpoint("http://example.com")         # PiShipError NETWORK_DENIED
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Mapping
from typing import cast

import requests
import requests.utils

from piship_remote.errors import CONFIG_INVALID, NETWORK_DENIED, PiShipError

__all__ = ["check_endpoint"]

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
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise PiShipError(CONFIG_INVALID, "Endpoint URL is not a valid URL") from None
    if parts.username is not None or parts.password is not None:
        raise PiShipError(CONFIG_INVALID, "Endpoint URLs must not embed credentials")
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    shown = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        shown = f"{shown}:{port}"
    if scheme != "https" and not (scheme == "http" and is_loopback(host)):
        raise PiShipError(
            NETWORK_DENIED,
            f"Refusing non-HTTPS endpoint {scheme}://{shown}; "
            "plain HTTP is only allowed for loopback test fixtures",
        )
    if not host:
        raise PiShipError(CONFIG_INVALID, "Endpoint URL has no host")
    return shown, f"{scheme}://{parts.netloc.lower()}"


def is_loopback(host: str) -> bool:
    """``localhost``, ``127.0.0.0/8`` or ``::1``."""
    if host == "localhost":
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
