"""What the local service enforces on this host, said exactly.

summary = containment(Limits(), Enforcement.probe())
summary.held        # ("processes", "memory", "cpu", "disk", "lifetime")
summary.warnings    # one sentence per thing that does not hold here
summary.lines()     # for ``serve`` and ``doctor``
"""

from __future__ import annotations

import attrs

from piship_remote.local.isolation.egress import rules_problem
from piship_remote.local.isolation.limits import MIB, Enforcement, Limits
from piship_remote.local.isolation.network import egress_problem

__all__ = ["Containment", "containment"]

NETWORK_DENY = "deny: loopback only, in the sandbox's own network namespace"
NETWORK_ALLOW = (
    "allow: egress through slirp4netns in the sandbox's own network namespace;"
    " the host's loopback, its abstract Unix sockets and other sandboxes are out of reach"
)
NETWORK_RULES = (
    "rules: allowOut/denyOut (addresses, CIDRs) held by an nftables ruleset in the sandbox's"
    " own network namespace, which its root cannot change"
)
COMMAND_LINES = (
    "a command's shell script and environment are not in any host process's command line or"
    " environment, but the programs a script starts show their own arguments to every user"
    " of this host (/proc), as any process does: pass secrets in the environment, not as"
    " arguments"
)


@attrs.frozen
class Containment:
    """The limits that hold, the network modes offered, and what does not hold, with why."""

    limits: Limits
    held: tuple[str, ...]
    network: tuple[str, ...]
    warnings: tuple[str, ...]

    def lines(self) -> list[str]:
        """Human-readable lines, one per fact."""
        limits = self.limits
        shown = [
            f"processes: {limits.processes}",
            f"memory: {limits.memory // MIB} MiB",
            f"disk: {limits.disk // MIB} MiB",
            f"lifetime: at most {limits.lifetime} s",
        ]
        lines = [f"limits per sandbox: {', '.join(shown)} (held: {', '.join(self.held)})"]
        held = "held" if "cpu" in self.held else "not held"
        lines.append(f"cpu per sandbox: at most {limits.cpus:g} CPUs of this host ({held})")
        lines += [f"network {mode}" for mode in self.network]
        lines += [f"warning: {warning}" for warning in self.warnings]
        return lines


def containment(limits: Limits, enforcement: Enforcement) -> Containment:
    """What a service with ``limits`` enforces on a host with ``enforcement``."""
    warnings = [*enforcement.problems, COMMAND_LINES]
    network = [NETWORK_DENY]
    problem = egress_problem()
    if problem is None:
        network.append(NETWORK_ALLOW)
        rules = rules_problem()
        if rules is None:
            network.append(NETWORK_RULES)
        else:
            warnings.append(f"egress rules (allowOut/denyOut) are refused: {rules}")
        warnings.append(
            "with network allowed, a sandbox can reach services listening on this host's"
            " non-loopback addresses, as any outside host could"
        )
    else:
        warnings.append(f"network allow is refused: {problem}")
    return Containment(limits, enforcement.held(), tuple(network), tuple(warnings))
