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

Values are checked too: a value holding a secret the library was given (passed
as ``secrets``, the backend's :class:`~piship_remote.model.redact.Redactor`), a
self-identifying token (``ghp_...``, ``sk-...``, ``AKIA...``, a PEM private key)
or a URL with a password in it is not sent under any name.
:func:`screen_environment` also says which names were dropped for their value::

    >>> screen_environment(["DATABASE_URL"], {"DATABASE_URL": "postgres://u:pw@db/app"}).warnings
    ('DATABASE_URL was not sent to the sandbox: its value is a URL with a password in it',)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import attrs

from piship_remote.model.redact import Redactor, has_token_shape

__all__ = [
    "HOST_BOUND_VARIABLES",
    "NETWORK_SETTING_VARIABLES",
    "DroppedVariable",
    "ScreenedEnvironment",
    "command_environment",
    "credential_value_reason",
    "is_credential_name",
    "is_network_setting_name",
    "screen_environment",
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
# Anywhere in a name (PGPASSWORD, DBPASSWD, SSH_PRIVATE_KEY), or as its last segment (MYSQL_PWD).
_CREDENTIAL_PARTS = ("PASSWORD", "PASSWD", "PRIVATE_KEY", "PRIVATEKEY")
_CREDENTIAL_SUFFIXES = ("_PWD",)
# scheme://user:password@ with a non-empty password; the scheme starts a word, so
# a failed attempt never rescans it from inside.
_URL_WITH_PASSWORD = re.compile(
    r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:]*:[^\s/?#@]+@"
)
# Sockets and CA bundles: they name a credential mechanism but hold none.
_NEVER_CREDENTIALS = frozenset({"SSH_AUTH_SOCK", "GPG_AGENT_INFO"})
_CA_NAMES = frozenset({"NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "SSL_CERT_DIR"})


def is_credential_name(name: str) -> bool:
    """Whether a variable name looks like it holds a credential.

    >>> [is_credential_name(n) for n in ("GITHUB_TOKEN", "PGPASSWORD", "MYSQL_PWD", "MY_TOKENS")]
    [True, True, True, False]
    """
    upper = name.upper()
    if upper in _NEVER_CREDENTIALS:
        return False
    if upper == "NODE_TLS_REJECT_UNAUTHORIZED":
        return True
    if upper in _CA_NAMES:
        return False
    return (
        bool(_CREDENTIAL_WORD.search(name))
        or upper.startswith(_CREDENTIAL_PREFIXES)
        or any(part in upper for part in _CREDENTIAL_PARTS)
        or upper.endswith(_CREDENTIAL_SUFFIXES)
    )


def credential_value_reason(value: str, secrets: Redactor | None = None) -> str | None:
    """Why ``value`` must not be sent, or ``None`` when it holds no credential we can see.

    >>> credential_value_reason("postgres://app:pw@db/app"), credential_value_reason("postgres://db/app")
    ('a URL with a password in it', None)
    """
    if secrets is not None and secrets.appears_in(value):
        return "a credential this library holds"
    if has_token_shape(value):
        return "a token-shaped credential"
    if _URL_WITH_PASSWORD.search(value):
        return "a URL with a password in it"
    return None


def is_network_setting_name(name: str) -> bool:
    """Whether a name governs proxies, CA bundles or TLS verification (any case).

    >>> is_network_setting_name("https_proxy"), is_network_setting_name("LANG")
    (True, False)
    """
    upper = name.upper()
    return upper in NETWORK_SETTING_VARIABLES or upper.startswith(_NETWORK_SETTING_PREFIXES)


@attrs.frozen
class DroppedVariable:
    """An allow-listed variable that was not sent because of its value (never the value
    itself), or, ``by_name``, because of its name."""

    name: str
    reason: str
    by_name: bool = False

    @property
    def warning(self) -> str:
        if self.by_name:
            return (
                f"{self.name} was not sent to the sandbox although environment.allow lists it:"
                f" {self.reason}"
            )
        return f"{self.name} was not sent to the sandbox: its value is {self.reason}"


@attrs.frozen
class ScreenedEnvironment:
    """The variables to send, in allow-list order, and the ones dropped, by name only.

    ``dropped``: allow-listed names not sent, for their value or their name.
    ``unlisted``: names the allow list does not cover (only when asked for: the
    caller handed over this environment on purpose); ``never_sent``: those among
    them that no allow list would pass (credential-looking or this host's settings).
    """

    env: dict[str, str]
    dropped: tuple[DroppedVariable, ...] = ()
    unlisted: tuple[str, ...] = ()
    never_sent: tuple[str, ...] = ()

    @property
    def warnings(self) -> tuple[str, ...]:
        found = [dropped.warning for dropped in self.dropped]
        if self.unlisted:
            names = ", ".join(self.unlisted)
            line = ", ".join(f'"{name}"' for name in self.unlisted)
            found.append(
                f"not sent to the sandbox, as the policy's environment.allow does not list"
                f" them: {names}; to send them, add them to the policy:"
                f" environment.allow: [{line}]"
            )
        if self.never_sent:
            found.append(
                "never sent to the sandbox, whatever the allow list says (credential-looking"
                f" names, or settings of this host): {', '.join(self.never_sent)}"
            )
        return tuple(found)


def screen_environment(
    allow: Sequence[str],
    source: Mapping[str, str],
    *,
    secrets: Redactor | None = None,
    allow_network_settings: bool = False,
    name_unlisted: bool = False,
) -> ScreenedEnvironment:
    """Apply the allow list to ``source``; see :func:`command_environment`.

    Allow-listed names dropped for their value, or because their name looks like a
    credential or a proxy/CA/TLS setting, are listed in ``dropped`` (host-bound names
    such as ``PATH`` are expected and not). With ``name_unlisted`` the names of
    ``source`` the allow list does not cover are listed too (``unlisted``, or
    ``never_sent`` when no allow list would pass them).
    """
    env: dict[str, str] = {}
    dropped: list[DroppedVariable] = []
    allowed = dict.fromkeys(allow)
    for name in allowed:
        if name not in source:
            continue
        refusal = _name_refusal(name, allow_network_settings)
        reason = refusal or credential_value_reason(source[name], secrets)
        if reason is None:
            env[name] = source[name]
        elif refusal is None:
            dropped.append(DroppedVariable(name, reason))
        elif refusal != _HOST_BOUND:
            dropped.append(DroppedVariable(name, refusal, by_name=True))
    if not name_unlisted:
        return ScreenedEnvironment(env, tuple(dropped))
    others = [name for name in source if name not in allowed]
    unlisted = tuple(n for n in others if _name_refusal(n, allow_network_settings) is None)
    never_sent = tuple(n for n in others if _name_refusal(n, allow_network_settings) is not None)
    return ScreenedEnvironment(env, tuple(dropped), unlisted, never_sent)


_HOST_BOUND = "it describes this host; the sandbox has its own"


def _name_refusal(name: str, allow_network_settings: bool) -> str | None:
    """Why a variable with this name is never sent, or ``None`` when its name may pass."""
    if is_credential_name(name):
        return "its name looks like a credential"
    if name.upper() in HOST_BOUND_VARIABLES:
        return _HOST_BOUND
    if not allow_network_settings and is_network_setting_name(name):
        return "it is a proxy, CA or TLS setting of this host"
    return None


def command_environment(
    allow: Sequence[str],
    source: Mapping[str, str],
    *,
    secrets: Redactor | None = None,
    allow_network_settings: bool = False,
) -> dict[str, str]:
    """The environment a remote command receives, in allow-list order.

    Each allowed name is looked up in ``source`` (exact case) and copied when
    present, except credential-looking names, host-bound names
    (:data:`HOST_BOUND_VARIABLES`, any case), unless ``allow_network_settings``
    proxy/CA/TLS settings (:func:`is_network_setting_name`), and any value
    :func:`credential_value_reason` objects to (a secret registered with
    ``secrets``, a token shape, a URL with a password).
    """
    return screen_environment(
        allow, source, secrets=secrets, allow_network_settings=allow_network_settings
    ).env
