"""Which environment variables reach a remote sandbox (reference §3)."""

from __future__ import annotations

import pytest

from piship_remote.environment import (
    HOST_BOUND_VARIABLES,
    NETWORK_SETTING_VARIABLES,
    command_environment,
    is_credential_name,
    is_network_setting_name,
)

# The seed's source environment and allow list.
SEED_ENV = {
    "PATH": "/opt/host/bin",
    "HOME": "/home/alice",
    "LANG": "C.UTF-8",
    "DOCS_MODE": "demo",
    "ACME_API_TOKEN": "acme-secret-token",
    "UNLISTED_VARIABLE": "unlisted-host-value",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-value",
    "GITHUB_TOKEN": "github-secret-value",
}
SEED_ALLOW = ["PATH", "HOME", "LANG", "DOCS_MODE", "ACME_API_TOKEN"]


def test_seed_walk_through() -> None:
    env = command_environment(SEED_ALLOW, SEED_ENV)
    assert list(env.items()) == [("LANG", "C.UTF-8"), ("DOCS_MODE", "demo")]


def test_per_command_override_is_filtered_the_same_way() -> None:
    override = {**SEED_ENV, "DOCS_MODE": "strict", "EXTRA": "x"}
    assert command_environment(SEED_ALLOW, override) == {"LANG": "C.UTF-8", "DOCS_MODE": "strict"}


def test_probe_variable_is_dropped_as_unlisted() -> None:
    env = command_environment(SEED_ALLOW, {**SEED_ENV, "PISHIP_PROBE_UNLISTED": "1"})
    assert "PISHIP_PROBE_UNLISTED" not in env


def test_order_follows_the_allow_list_not_the_source() -> None:
    env = command_environment(["B", "A"], {"A": "1", "B": "2"})
    assert list(env) == ["B", "A"]


def test_duplicate_allow_entries_are_copied_once() -> None:
    assert list(command_environment(["A", "B", "A"], {"A": "1", "B": "2"})) == ["A", "B"]


def test_lookup_is_case_sensitive() -> None:
    assert command_environment(["lang"], {"LANG": "C"}) == {}


def test_values_are_not_inspected() -> None:
    env = command_environment(["NOTE"], {"NOTE": "Bearer abcdefgh12345678"})
    assert env == {"NOTE": "Bearer abcdefgh12345678"}


@pytest.mark.parametrize(
    "name", ["PATH", "path", "Home", "USER", "LOGNAME", "SHELL", "TMPDIR", "pwd"]
)
def test_host_bound_names_are_dropped_in_any_case(name: str) -> None:
    assert command_environment([name], {name: "/host"}) == {}


def test_host_bound_constant() -> None:
    assert frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "PWD"}) == (
        HOST_BOUND_VARIABLES
    )


@pytest.mark.parametrize(
    "name",
    [
        "HTTPS_PROXY",
        "https_proxy",
        "NO_PROXY",
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "npm_config_registry",
        "YARN_HTTPS_PROXY",
        "GIT_CONFIG_COUNT",
        "JAVA_TOOL_OPTIONS",
        "PYTHONHTTPSVERIFY",
        "GIT_SSL_NO_VERIFY",
    ],
)
def test_network_settings_are_dropped_by_default(name: str) -> None:
    assert command_environment([name], {name: "x"}) == {}


def test_network_settings_pass_when_allowed() -> None:
    env = command_environment(
        ["HTTPS_PROXY", "SSL_CERT_FILE", "LANG"],
        {"HTTPS_PROXY": "http://proxy:3128", "SSL_CERT_FILE": "/ca.pem", "LANG": "C"},
        allow_network_settings=True,
    )
    assert env == {"HTTPS_PROXY": "http://proxy:3128", "SSL_CERT_FILE": "/ca.pem", "LANG": "C"}


def test_tls_switch_stays_out_even_when_network_settings_are_allowed() -> None:
    env = command_environment(
        ["NODE_TLS_REJECT_UNAUTHORIZED"],
        {"NODE_TLS_REJECT_UNAUTHORIZED": "0"},
        allow_network_settings=True,
    )
    assert env == {}


def test_network_setting_names() -> None:
    assert "HTTP_PROXY" in NETWORK_SETTING_VARIABLES
    assert is_network_setting_name("all_proxy")
    assert not is_network_setting_name("LANG")


@pytest.mark.parametrize(
    "name",
    [
        "GITHUB_TOKEN",
        "DB_PASSWORD_FILE",
        "APIKEY",
        "X_AUTH",
        "ACME_API_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "aws_region",
        "MY_SECRET",
        "SECRET_KEY",
        "MY_SECRETKEY",
        "SESSION_TOKEN",
        "SERVICE_CREDENTIALS",
        "ACCESS_KEY_ID",
        "OPENAI_BASE_URL",
        "HF_HOME",
        "GH_TOKEN",
        "PI_CONFIG",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "NODE_TLS_REJECT_UNAUTHORIZED",
        "api_key",
    ],
)
def test_credential_names(name: str) -> None:
    assert is_credential_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "TOKENIZERS_PARALLELISM",
        "MY_TOKENS",
        "OAUTH_URL",
        "PRIVATE_KEY",
        "SSH_AUTH_SOCK",
        "GPG_AGENT_INFO",
        "NODE_EXTRA_CA_CERTS",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "LANG",
        "DOCS_MODE",
        "AUTHOR",
        "HTTPS_PROXY",
    ],
)
def test_not_credential_names(name: str) -> None:
    assert not is_credential_name(name)


def test_credential_names_are_skipped_even_when_listed() -> None:
    env = command_environment(["GITHUB_TOKEN", "LANG"], {"GITHUB_TOKEN": "t", "LANG": "C"})
    assert env == {"LANG": "C"}
