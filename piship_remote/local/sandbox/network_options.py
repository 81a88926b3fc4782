"""What a create asks of a sandbox's network, and the options this service cannot hold.

Every create option is enforced, or refused with a 400 naming it; none is accepted and
ignored. Held: ``allow_internet_access`` (omitted means on, as on E2B), ``network``'s
``allowOut``/``denyOut`` (addresses and CIDRs; see
:mod:`~piship_remote.local.isolation.egress`), ``allowPublicTraffic`` and
``maskRequestHost``. Refused: ``network``'s ``dnsServers``, ``egressProxy``, ``rules``
and ``httpsPorts`` (they need E2B's egress proxy), ``iam`` and ``volumeMounts`` (no
cloud identity or volumes here). ``mcp`` is the SDKs' own business: they start the
gateway with a command in the sandbox, which needs a template that has it::

    options = NetworkOptions.of(json.loads(body))     # OptionRefused: answer 400
    options.egress, options.mask_request_host, options.echo()
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from piship_remote.local.isolation.egress import EgressRules, RulesRefused

__all__ = ["NetworkOptions", "OptionRefused", "masked_host"]

_PROXY_ONLY = ("dnsServers", "egressProxy", "rules", "httpsPorts")
_NOT_HERE = {
    "iam": "cloud identities",
    "volumeMounts": "volumes",
}


class OptionRefused(ValueError):
    """A create or update option this service cannot hold (the message names it)."""


@attrs.frozen
class NetworkOptions:
    """A sandbox's network as asked: its egress rules, whether its ports want its
    traffic token, and the ``Host`` its port requests carry (``${PORT}`` filled in)."""

    egress: EgressRules = attrs.field(factory=EgressRules)
    private_traffic: bool = False
    mask_request_host: str | None = None

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> NetworkOptions:
        """The options of a create body; :class:`OptionRefused` for one not held here."""
        for key, what in _NOT_HERE.items():
            if body.get(key):
                raise OptionRefused(f"the local service has no {what}: leave {key} out")
        network = body.get("network") or {}
        if not isinstance(network, Mapping):
            raise OptionRefused("network must be an object")
        _refuse_proxy_options(network)
        given = body.get("allow_internet_access")
        if given is not None and not isinstance(given, bool):
            raise OptionRefused("allow_internet_access must be true or false")
        mask = network.get("maskRequestHost")
        if mask is not None and (not isinstance(mask, str) or not _header_safe(mask)):
            raise OptionRefused("network.maskRequestHost must be a host name (with ${PORT})")
        return cls(
            egress=_egress_of(given is not False, network.get("allowOut"), network.get("denyOut")),
            private_traffic=network.get("allowPublicTraffic") is False,
            mask_request_host=mask or None,
        )

    def with_egress(self, egress: EgressRules) -> NetworkOptions:
        """These options with the egress rules an update set."""
        return attrs.evolve(self, egress=egress)

    def echo(self) -> tuple[bool, dict[str, Any]]:
        """``allowInternetAccess`` and ``network`` as ``get_info`` shows them."""
        network: dict[str, Any] = {"allowPublicTraffic": not self.private_traffic}
        if self.egress.allow_out:
            network["allowOut"] = list(self.egress.allow_out)
        if self.egress.deny_out:
            network["denyOut"] = list(self.egress.deny_out)
        if self.mask_request_host is not None:
            network["maskRequestHost"] = self.mask_request_host
        return self.egress.internet, network


def _refuse_proxy_options(network: Mapping[str, Any]) -> None:
    """:class:`OptionRefused` if ``network`` asks for what only E2B's egress proxy does."""
    for key in _PROXY_ONLY:
        if network.get(key):
            raise OptionRefused(
                f"the local service has no egress proxy: network.{key} cannot be held "
                "here (allowOut and denyOut take addresses and CIDRs)"
            )


def _egress_of(internet: bool, allow_out: object, deny_out: object) -> EgressRules:
    """Egress rules from a body's fields; :class:`OptionRefused` when they are malformed
    or name what cannot be filtered here."""
    lists = []
    for name, value in (("allowOut", allow_out), ("denyOut", deny_out)):
        if value is None:
            value = []
        if not isinstance(value, list) or not all(isinstance(e, str) for e in value):
            raise OptionRefused(f"network.{name} must be a list of strings")
        lists.append(value)
    try:
        return EgressRules.of(internet=internet, allow_out=lists[0], deny_out=lists[1])
    except RulesRefused as e:
        raise OptionRefused(str(e)) from None


def masked_host(mask: str, port: int) -> str:
    """The ``Host`` a request to ``port`` carries under ``maskRequestHost`` ``mask``."""
    return mask.replace("${PORT}", str(port))


def _header_safe(value: str) -> bool:
    return all(32 < ord(c) < 127 for c in value)
