"""Which environment variables may reach a remote sandbox.

A command's environment is built from an allow list, never copied wholesale::

    >>> command_environment(
    ...     ["PATH", "LANG", "DOCS_MODE", "ACME_API_TOKEN"],
    ...     {"PATH": "/opt/host/bin", "LANG": "C.UTF-8", "DOCS_MODE": "demo",
    ...      "ACME_API_TOKEN": "t0ken", "UNLISTED": "x"},
    ... )
    {'LANG': 'C.UTF-8', 'DOCS_MODE': 'demo'}

Credential-looking names are skipped even when listed, proxy/CA/TLS settings
describe this host and are dropped unless asked for, and host-bound names
(``PATH``, ``HOME``, ...) are dropped because the remote image has its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

__all__ = [
    "HOST_BOUND_VARIABLES",
    "NETWORK_SETTING_VARIABLES",
    "command_environment",
    "is_credential_name",
    "is_network_setting_name",
]

HOST_BOUND_VARIABLES: frozenset[str] = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "PWD"}
)
"""Names (upper case) that describe this host; a remote sandbox provides its own."""

NETWORK_SETTING_VARIABLES: frozenset[str] = frozenset(
    {
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "FTP_PROXY",
        "RSYNC_PROXY",
        "SOCKS_PROXY",
        "SOCKS5_SERVER",
        "NODE_EXTRA_CA_CERTS",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "CURL_CA_BUNDLE",
        "CURL_HOME",
        "WGETRC",
        "REQUESTS_CA_BUNDLE",
        "PIP_CERT",
        "PIP_PROXY",
        "PIP_TRUSTED_HOST",
        "PYTHONHTTPSVERIFY",
        "GIT_SSL_CAINFO",
        "GIT_SSL_CAPATH",
        "GIT_SSL_NO_VERIFY",
        "GIT_PROXY_COMMAND",
        "CARGO_HTTP_PROXY",
        "CARGO_HTTP_CAINFO",
        "DENO_CERT",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "NODE_TLS_REJECT_UNAUTHORIZED",
    }
)
"""Proxy, CA and TLS-verification names (upper case; matched case-insensitively).
The families ``NPM_CONFIG_*``, ``YARN_*`` and ``GIT_CONFIG_*`` count too."""

_NETWORK_SETTING_PREFIXES = ("NPM_CONFIG_", "YARN_", "GIT_CONFIG_")

_CREDENTIAL_WORD = re.compile(
    r"(?:^|_)(?:API_?KEY|ACCESS_?KEY|SECRET(?:_ACCESS)?_?KEY|SECRET|TOKEN|SESSION_?TOKEN"
    r"|PASSWORD|CREDENTIALS?|AUTH)(?:_|\Z)",
    re.IGNORECASE,
)
_CREDENTIAL_PREFIXES = (
    "AWS_",
    "AZURE_",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_",
    "VERTEX_",
    "ANTHROPIC_",
    "OPENAI_",
    "GEMINI_",
    "MISTRAL_",
    "GROQ_",
    "XAI_",
    "OPENROUTER_",
    "CEREBRAS_",
    "DEEPSEEK_",
    "HF_",
    "COPILOT_",
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "PI_",
)
# Sockets and CA bundles: they name a credential mechanism but hold none.
_NEVER_CREDENTIALS = frozenset({"SSH_AUTH_SOCK", "GPG_AGENT_INFO"})
_CA_NAMES = frozenset({"NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "SSL_CERT_DIR"})


def is_credential_name(name: str) -> bool:
    """Whether a variable name looks like it holds a credential.

    >>> [is_credential_name(n) for n in ("GITHUB_TOKEN", "DB_PASSWORD_FILE", "MY_TOKENS")]
    [True, True, False]
    """
    upper = name.upper()
    if upper in _NEVER_CREDENTIALS:
        return False
    if upper == "NODE_TLS_REJECT_UNAUTHORIZED":
        return True
    if upper in _CA_NAMES:
        return False
    return bool(_CREDENTIAL_WORD.search(name)) or upper.startswith(_CREDENTIAL_PREFIXES)


def is_network_setting_name(name: str) -> bool:
    """Whether a name governs proxies, CA bundles or TLS verification (any case).

    >>> is_network_setting_name("https_proxy"), is_network_setting_name("LANG")
    (True, False)
    """
    upper = name.upper()
    return upper in NETWORK_SETTING_VARIABLES or upper.startswith(_NETWORK_SETTING_PREFIXES)


def command_environment(
    allow: Sequence[str],
    source: Mapping[str, str],
    *,
    allow_network_settings: bool = False,
) -> dict[str, str]:
    """The environment a remote command receives, in allow-list order.

    Each allowed name is looked up in ``source`` (exact case) and copied when
    present, except credential-looking names, host-bound names
    (:data:`HOST_BOUND_VARIABLES`, any case) and, unless
    ``allow_network_settings``, proxy/CA/TLS settings
    (:func:`is_network_setting_name`). Values are not inspected.
    """
    output: dict[str, str] = {}
    for name in allow:
        if name in output or name not in source or is_credential_name(name):
            continue
        if name.upper() in HOST_BOUND_VARIABLES:
            continue
        if not allow_network_settings and is_network_setting_name(name):
            continue
        output[name] = source[name]
    return output
