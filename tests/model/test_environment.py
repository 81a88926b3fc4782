"""Which environment variables reach a remote sandbox: allowed names, then safe values."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.model.environment import (
    HOST_BOUND_VARIABLES,
    NETWORK_SETTING_VARIABLES,
    DroppedVariable,
    command_environment,
    is_credential_name,
    is_network_setting_name,
    screen_environment,
)
from piship_remote.model.redact import Redactor
from piship_remote.sandbox.activation import activate_sandbox
from piship_remote.testing import E2bServer
from piship_remote.wire.connect import EnvelopeReader

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


def test_a_value_without_a_self_identifying_token_is_sent() -> None:
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
        "PGPASSWORD",
        "DBPASSWORD",
        "MYSQL_PWD",
        "REDIS_PWD",
        "LDAP_PASSWD",
        "PRIVATE_KEY",
        "SSH_PRIVATE_KEY",
        "DEPLOY_PRIVATE_KEY_PATH",
        "signing_privatekey",
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
        "OLDPWD",
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


API_KEY = "e2b_live_key_4f1c9a7d2b"


def _holding(secret: str) -> Redactor:
    redactor = Redactor()
    redactor.register(secret)
    return redactor


def test_a_planted_api_key_under_lang_is_dropped_and_reported() -> None:
    screened = screen_environment(
        ["LANG", "DOCS_MODE"], {"LANG": API_KEY, "DOCS_MODE": "demo"}, secrets=_holding(API_KEY)
    )
    assert screened.env == {"DOCS_MODE": "demo"}
    assert screened.dropped == (DroppedVariable("LANG", "a credential this library holds"),)
    assert screened.warnings == (
        "LANG was not sent to the sandbox: its value is a credential this library holds",
    )
    assert API_KEY not in "".join(screened.warnings)


@pytest.mark.parametrize(
    "value",
    [
        f"prefix {API_KEY} suffix",
        "ZTJiX2xpdmVfa2V5XzRmMWM5YTdkMmI=",  # base64
        "https://api.example/?key=e2b_live_key_4f1c9a7d2b",
    ],
)
def test_a_held_credential_is_found_inside_a_value_and_in_its_encodings(value: str) -> None:
    assert command_environment(["NOTE"], {"NOTE": value}, secrets=_holding(API_KEY)) == {}


@pytest.mark.parametrize(
    "value",
    [
        "ghp_" + "a1B2" * 9,
        "github_pat_" + "x" * 30,
        "sk-proj-abcdef123456",
        "AKIAABCDEFGHIJKLMNOP",
        "xoxb-1234567890-abcdef",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk=\n-----END OPENSSH PRIVATE KEY-----",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEow",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjMifQ.sig",
    ],
)
def test_a_token_shaped_value_is_dropped_even_when_allow_listed(value: str) -> None:
    screened = screen_environment(["LANG", "TZ"], {"LANG": value, "TZ": "UTC"})
    assert screened.env == {"TZ": "UTC"}
    assert screened.dropped == (DroppedVariable("LANG", "a token-shaped credential"),)


@pytest.mark.parametrize(
    "value",
    [
        "postgres://u:p@h/db",
        "mysql://root:hunter2@127.0.0.1:3306/app",
        "redis://:secret@cache:6379/0",
        "use amqp://guest:guest@rabbit/ for the queue",
    ],
)
def test_a_url_with_a_password_is_dropped_under_any_name(value: str) -> None:
    screened = screen_environment(["DATABASE_URL"], {"DATABASE_URL": value})
    assert screened.env == {}
    assert screened.warnings == (
        "DATABASE_URL was not sent to the sandbox: its value is a URL with a password in it",
    )


@pytest.mark.parametrize(
    "value",
    ["postgres://h/db", "postgres://user@h/db", "https://example.com/a:b@c", "C.UTF-8", "a:b@c"],
)
def test_a_url_without_a_password_is_sent(value: str) -> None:
    assert command_environment(["DATABASE_URL"], {"DATABASE_URL": value}) == {"DATABASE_URL": value}


def test_allow_listed_names_dropped_by_name_are_named_with_why_and_host_names_are_not() -> None:
    screened = screen_environment(
        ["PATH", "GITHUB_TOKEN", "HTTPS_PROXY"],
        {"PATH": "/bin", "GITHUB_TOKEN": "ghp_" + "a" * 36, "HTTPS_PROXY": "http://u:p@proxy"},
    )
    assert screened.env == {}
    assert screened.warnings == (
        "GITHUB_TOKEN was not sent to the sandbox although environment.allow lists it:"
        " its name looks like a credential",
        "HTTPS_PROXY was not sent to the sandbox although environment.allow lists it:"
        " it is a proxy, CA or TLS setting of this host",
    )
    assert "ghp_" not in "".join(screened.warnings)
    assert "u:p" not in "".join(screened.warnings)


def test_unlisted_names_are_named_with_the_allow_list_line_that_passes_them() -> None:
    screened = screen_environment(
        ["LANG"],
        {"LANG": "C", "FOO": "bar", "BAZ": "qux", "AWS_SECRET_ACCESS_KEY": "x", "HOME": "/h"},
        name_unlisted=True,
    )
    assert screened.env == {"LANG": "C"}
    assert screened.unlisted == ("FOO", "BAZ")
    assert screened.never_sent == ("AWS_SECRET_ACCESS_KEY", "HOME")
    assert screened.warnings[0].endswith('environment.allow: ["FOO", "BAZ"]')
    assert "FOO, BAZ" in screened.warnings[0]
    assert "AWS_SECRET_ACCESS_KEY, HOME" in screened.warnings[1]
    assert not any(value in "".join(screened.warnings) for value in ("bar", "qux", "/h"))


def test_unlisted_names_are_not_named_unless_asked() -> None:
    screened = screen_environment(["LANG"], {"LANG": "C", "FOO": "bar"})
    assert (screened.unlisted, screened.warnings) == ((), ())


def test_a_value_check_needs_no_redactor() -> None:
    assert command_environment(["LANG"], {"LANG": API_KEY}) == {"LANG": API_KEY}


def test_activation_drops_and_reports_its_own_api_key_planted_under_lang(
    e2b_server: Callable[..., E2bServer], workspace: Path, home: Path
) -> None:
    key = "fake-sandbox-key-SENTINEL-0017"
    mock = e2b_server(api_key=key)
    backend = E2bCompatibleBackend(
        endpoint=mock.url, envd_url=mock.url, template="piship-workspace", credential=lambda: key
    )
    policy = {"required": True, "environment": {"allow": ["LANG", "DOCS_MODE"]}}
    env = {"LANG": key, "DOCS_MODE": "demo"}
    with activate_sandbox(
        policy, backend=backend, workspace=workspace, home_dir=home, env=env
    ) as sandbox:
        sandbox.exec("env")
        warnings = sandbox.report.warnings
    assert "LANG was not sent to the sandbox: its value is a credential this library holds" in (
        warnings
    )
    starts = [r for r in mock.requests if r.path == "/process.Process/Start"]
    assert starts
    for request in starts:
        assert EnvelopeReader().push(request.body)[0].message["process"]["envs"] == {
            "DOCS_MODE": "demo"
        }
    assert key not in json.dumps(sandbox.report.to_dict())
