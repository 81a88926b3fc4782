"""A sandbox's egress rules (E2B's ``allow_internet_access``, ``network.allowOut`` and
``denyOut``), held by an nftables ruleset in the sandbox's own network namespace.

Why there and why it holds against the sandbox's root: the service runs as root, so
bubblewrap makes each sandbox's network namespace outside the sandbox's user namespace.
No process of the sandbox, its root included, holds ``CAP_NET_ADMIN`` (or ``CAP_NET_RAW``)
over that namespace: it can neither change nor flush the ruleset the service loads
there (``nsenter --net`` + ``nft``), nor send around it. The ruleset is loaded as soon
as the user-mode stack is up, before the create is answered (and again after a
reboot), and replaced whole by ``update_network``. Run unprivileged, the namespace
belongs to the sandbox's own user namespace: rules are then refused, never loaded.

E2B's meaning: ``allow_internet_access: false`` is ``denyOut: ["0.0.0.0/0"]``, and an
address ``allowOut`` names is reachable whatever ``denyOut`` says. Entries are IP
addresses or CIDRs; a domain name is refused (nothing here reads the names a sandbox
connects to)::

    rules = EgressRules.of(internet=True, allow_out=["1.1.1.1"], deny_out=["0.0.0.0/0"])
    problem = rules_problem()          # None when rules can be held here
    load_rules(pid, rules)             # pid: a process inside the namespace
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from collections.abc import Iterable

import attrs

__all__ = ["ALL_TRAFFIC", "EgressRules", "RulesRefused", "load_rules", "rules_problem"]

ALL_TRAFFIC = "0.0.0.0/0"
TABLE = "piship_egress"
LOAD_TIMEOUT = 10.0
REFUSE = "reject with icmpx type admin-prohibited"
"""What a denied packet gets: refused at once ("No route to host"), not left to time out."""
NFT_HINT = "install nftables (Debian/Ubuntu: apt-get install nftables)"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class RulesRefused(ValueError):
    """Egress rules this service cannot hold (the message names what and why)."""


@attrs.frozen
class EgressRules:
    """What a sandbox may reach: everything but ``deny_out`` (``internet``) or nothing
    but ``allow_out``; ``allow_out`` wins over ``deny_out``."""

    internet: bool = True
    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, *, internet: bool, allow_out: Iterable[str] = (), deny_out: Iterable[str] = ()
    ) -> EgressRules:
        """The rules as given (their entries kept as sent, for echoing them back);
        :class:`RulesRefused` for an entry that is not an address or a CIDR."""
        allowed, denied = tuple(allow_out), tuple(deny_out)
        for field, entries in (("allowOut", allowed), ("denyOut", denied)):
            for entry in entries:
                _network(field, entry)
        return cls(internet, allowed, denied)

    @property
    def filtered(self) -> bool:
        """Whether a ruleset must be loaded: the sandbox reaches out, but not everywhere."""
        return self.reaches_out and (bool(self.allow_out or self.deny_out) or not self.internet)

    @property
    def reaches_out(self) -> bool:
        """Whether the sandbox needs a network stack at all (some address is allowed)."""
        return self.internet or bool(self.allow_out)

    def ruleset(self) -> str:
        """The nftables script that replaces the sandbox's egress table with these rules."""
        lines = [
            f"table inet {TABLE}",
            f"delete table inet {TABLE}",
            f"table inet {TABLE} {{",
            "  chain output {",
            "    type filter hook output priority 0; policy accept;",
            '    oifname "lo" accept',
        ]
        lines += [f"    {_match('allowOut', e)} accept" for e in self.allow_out]
        lines += [f"    {_match('denyOut', e)} {REFUSE}" for e in self.deny_out]
        if not self.internet:
            lines.append(f"    {REFUSE}")
        lines += ["  }", "}"]
        return "\n".join(lines) + "\n"


def _network(field: str, entry: str) -> Network:
    try:
        return ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        raise RulesRefused(
            f"the local service filters egress by IP address or CIDR only, not {field} "
            f"entry {entry!r} (a domain name needs a proxy it does not have)"
        ) from None


def _match(field: str, entry: str) -> str:
    network = _network(field, entry)
    family = "ip" if network.version == 4 else "ip6"
    return f"{family} daddr {network.with_prefixlen}"


def _nft() -> str | None:
    return shutil.which("nft") or shutil.which("nft", path="/usr/sbin:/sbin")


def rules_problem() -> str | None:
    """Why egress rules cannot be held here (so they are refused), or ``None``."""
    if os.geteuid() != 0:
        return (
            "egress rules need the service to run as root (only then is a sandbox's "
            "network namespace out of its own root's reach)"
        )
    if _nft() is None or shutil.which("nsenter") is None:
        return f"egress rules need nft and nsenter; {NFT_HINT}"
    return None


def load_rules(pid: int, rules: EgressRules) -> None:
    """Replace the egress rules of the network namespace of ``pid`` with ``rules``.

    ``OSError`` when they could not be loaded (the caller must then not let the
    sandbox run: it would have more egress than it was given)."""
    problem = rules_problem()
    if problem is not None:
        raise OSError(problem)
    argv = ["nsenter", f"--net=/proc/{pid}/ns/net", "--", str(_nft()), "-f", "-"]
    try:
        done = subprocess.run(
            argv,
            input=rules.ruleset().encode(),
            capture_output=True,
            timeout=LOAD_TIMEOUT,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise OSError("nft did not load the sandbox's egress rules in time") from None
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip().splitlines()
        raise OSError(f"nft refused the sandbox's egress rules: {reason[-1] if reason else ''}")
