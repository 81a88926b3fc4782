"""A create's network options: the egress rules they make (and their nftables ruleset),
what ``get_info`` echoes, and the options refused with the reason."""

from __future__ import annotations

from typing import Any

import pytest

from piship_remote.local.isolation.egress import EgressRules
from piship_remote.local.sandbox.network_options import NetworkOptions, OptionRefused, masked_host


def rule_lines(rules: EgressRules) -> list[str]:
    """The output chain's rules, one per line, without the chain's own header."""
    lines = [line.strip() for line in rules.ruleset().splitlines()]
    return lines[lines.index('oifname "lo" accept') + 1 : lines.index("}")]


def test_a_create_without_network_options_has_all_egress_and_no_ruleset() -> None:
    options = NetworkOptions.of({"templateID": "base"})
    assert options.egress == EgressRules(internet=True)
    assert not options.egress.filtered


def test_internet_off_without_allow_out_has_no_network_at_all() -> None:
    rules = NetworkOptions.of({"allow_internet_access": False}).egress
    assert not rules.reaches_out and not rules.filtered


def test_allowed_addresses_come_before_denied_ones() -> None:
    body = {"network": {"allowOut": ["10.0.2.2"], "denyOut": ["0.0.0.0/0"]}}
    rules = NetworkOptions.of(body).egress
    assert rule_lines(rules) == [
        "ip daddr 10.0.2.2/32 accept",
        "ip daddr 0.0.0.0/0 reject with icmpx type admin-prohibited",
    ]


def test_internet_off_with_allow_out_refuses_everything_else() -> None:
    body: dict[str, Any] = {"allow_internet_access": False, "network": {"allowOut": ["::1/128"]}}
    rules = NetworkOptions.of(body).egress
    assert rules.filtered
    assert rule_lines(rules) == [
        "ip6 daddr ::1/128 accept",
        "reject with icmpx type admin-prohibited",
    ]


def test_get_info_echoes_the_rules_as_sent() -> None:
    body = {
        "allow_internet_access": True,
        "network": {
            "allowOut": ["10.0.2.2"],
            "denyOut": ["0.0.0.0/0"],
            "allowPublicTraffic": False,
            "maskRequestHost": "app.example:${PORT}",
        },
    }
    assert NetworkOptions.of(body).echo() == (
        True,
        {
            "allowPublicTraffic": False,
            "allowOut": ["10.0.2.2"],
            "denyOut": ["0.0.0.0/0"],
            "maskRequestHost": "app.example:${PORT}",
        },
    )


def test_the_masked_host_names_the_port() -> None:
    assert masked_host("app.example:${PORT}", 8080) == "app.example:8080"


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"network": {"allowOut": ["example.com"]}}, "'example.com'"),
        ({"network": {"denyOut": ["*.example.com"]}}, "'*.example.com'"),
        ({"network": {"egressProxy": {"address": "127.0.0.1:3128"}}}, "network.egressProxy"),
        ({"network": {"dnsServers": ["127.0.0.53"]}}, "network.dnsServers"),
        ({"network": {"rules": {"example.com": []}}}, "network.rules"),
        ({"network": {"httpsPorts": [8443]}}, "network.httpsPorts"),
        ({"network": {"allowOut": "10.0.2.2"}}, "network.allowOut"),
        ({"iam": {"tokens": ["t"]}}, "iam"),
        ({"volumeMounts": [{"name": "v", "path": "/data"}]}, "volumeMounts"),
        ({"allow_internet_access": "yes"}, "allow_internet_access"),
    ],
)
def test_what_cannot_be_held_is_refused_naming_it(body: dict[str, Any], named: str) -> None:
    with pytest.raises(OptionRefused, match=named.replace("*", r"\*").replace(".", r"\.")):
        NetworkOptions.of(body)


def test_an_mcp_option_is_left_to_the_sdk() -> None:
    assert NetworkOptions.of({"mcp": {"server": {}}}) == NetworkOptions()
