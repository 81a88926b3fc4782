"""Removing secrets from text before it reaches an error, a report or a log.

Two layers, applied in this order:

1. registered secrets (a :class:`Redactor` per backend): every credential the
   library sends, in each encoding it can appear in on the wire;
2. pattern rules (:func:`redact`): token shapes and ``name: value`` pairs that
   look like credentials, whether or not anyone registered them::

    >>> redact("authorization: Bearer abc.def.ghi")
    'authorization: [REDACTED]'
    >>> r = Redactor()
    >>> r.register("s3cr3t-key")
    >>> r.redact("the key s3cr3t-key was rejected")
    'the key [REDACTED] was rejected'

:func:`redact_value` deep-copies JSON-like detail, replacing the values of
secret-named keys as a whole.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "REDACTED",
    "SECRET_KEY_PATTERN",
    "Redactor",
    "has_token_shape",
    "redact",
    "redact_value",
    "redaction",
]

REDACTED = "[REDACTED]"

_MIN_SECRET = 6

# JavaScript's \b is ASCII-only; these spell it out so that a non-ASCII letter
# in front of a token does not shield it (Python's \b is Unicode-aware).
_START = r"(?<![A-Za-z0-9_])"
_END = r"(?![A-Za-z0-9_])"
# An optional quote, possibly backslash-escaped (`"`, `\"`, `\\\"`), around a key.
_QUOTE = r'(?:\\*")?'

_Rule = tuple[tuple[str, ...], "re.Pattern[str]", bool]


def _rule(triggers: str, pattern: str, flags: int = 0, *, keep_label: bool = False) -> _Rule:
    return (tuple(triggers.split()), re.compile(pattern, flags), keep_label)


# (triggers, pattern, keep_label). A pattern runs only when one of its trigger
# words occurs in the lower-cased text (a cheap substring test that keeps long
# text fast). With keep_label the first group (a `name:` label) stays and only
# what follows it is replaced; otherwise the whole match is replaced. No pattern
# has nested unbounded repetition, so scanning is linear in the text length.
#
# Tokens that identify themselves by their shape (a vendor prefix, a JWT, a PEM
# private-key block): a credential wherever they occur.
_TOKEN_RULES: tuple[_Rule, ...] = (
    _rule("sk-", rf"{_START}sk-[A-Za-z0-9_-]{{6,}}"),
    # JWT shapes start only at the beginning of a token run, so a failed attempt
    # never rescans the run from inside (quadratic on "ey-ey-ey-...").
    _rule("ey", r"(?<![A-Za-z0-9_-])ey[A-Za-z0-9_-]{10,}\.ey[A-Za-z0-9_-]{10,}\.?[A-Za-z0-9_-]*"),
    _rule("eyj", r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]*"),
    _rule(
        "ghp_ gho_ ghu_ ghs_ ghr_ github_pat_",
        rf"{_START}(?:gh[pousr]_[A-Za-z0-9]{{20,}}|github_pat_[A-Za-z0-9_]{{20,}})",
    ),
    _rule("xox", rf"{_START}xox[abposr]-[A-Za-z0-9-]{{10,}}"),
    _rule("akia asia", rf"{_START}(?:AKIA|ASIA)[A-Z0-9]{{16}}{_END}"),
    _rule("aiza", rf"{_START}AIza[A-Za-z0-9_-]{{30,}}"),
    _rule("glpat-", rf"{_START}glpat-[A-Za-z0-9_-]{{16,}}"),
    _rule(
        "private",
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)",
    ),
)

_RULES: tuple[_Rule, ...] = (
    # Any Authorization scheme (Bearer, Basic, Token, ...) or a bare credential.
    _rule(
        "authorization",
        rf"(authorization{_QUOTE}\s*[:=]\s*{_QUOTE})"
        r"(?:[A-Za-z][A-Za-z0-9_.-]*\s+)?[^\s\"',;\\]+",
        re.IGNORECASE,
        keep_label=True,
    ),
    # A cookie header carries several `name=value; ` pairs up to the line end.
    _rule(
        "cookie",
        rf"((?:set-)?cookie{_QUOTE}\s*:\s*{_QUOTE})(?:\\[^\"\r\n]|[^\"\r\n\\])+",
        re.IGNORECASE,
        keep_label=True,
    ),
    _rule("bearer", rf"{_START}bearer\s+[A-Za-z0-9._~+/=-]{{8,}}", re.IGNORECASE),
    # A standalone Basic credential must look like base64 (a digit, `+`, `/`, `=`,
    # or a lower-to-upper case change) so "basic authentication" stays readable.
    # Case-sensitive on purpose: the case change is the signal.
    _rule(
        "basic",
        rf"{_START}(?:[Bb]asic|BASIC)\s+"
        r"(?=[A-Za-z0-9+/]*(?:[0-9+/=]|[a-z][A-Z]))[A-Za-z0-9+/]{12,}={0,2}",
    ),
    *_TOKEN_RULES,
    # A key, header or query parameter whose name ends in a credential word, with
    # any separator (`X-Api-Key: v`, `client_secret=v`, `?token=v`, `"password":"v"`).
    # The match starts at the word, so the rest of a long name is never rescanned.
    # Prose that labels a problem ("sandbox credential: delete <ref>: ...") is not
    # a value: `delete `, `the ` and `revocation: ` are kept when text follows, and
    # so is code in a hint (`credential=lambda: os.environ[...]`).
    _rule(
        "token secret passw credential key",
        r"((?:token|secret|passw(?:or)?d|credentials?|(?:api|access|secret|private)[-_]?key)"
        rf"{_QUOTE}\s*[:=]\s*{_QUOTE})"
        r"(?!(?:delete|the|revocation:)\s|lambda\s*:)(?:\\[^\"\s]|[^\"\s,}&\\])+",
        re.IGNORECASE,
        keep_label=True,
    ),
)

SECRET_KEY_PATTERN = re.compile(
    r"(?:x[-_])?(?:(?:access|refresh|id|auth|api|bearer|session|csrf|xsrf)[-_]?token|token"
    r"|credential|secret|client[-_]?secret|api[-_]?key|private[-_]?key|password|passwd"
    r"|(?:proxy[-_]?)?authorization|(?:set[-_]?)?cookie|bearer)",
    re.IGNORECASE,
)
"""Dictionary keys whose values are secret whatever they hold (``apiToken``,
``x-api-key``, ``auth_token``, ``Authorization``, ...). Use ``fullmatch``;
counts such as ``maxTokens`` do not match."""


def _keep_label(match: re.Match[str]) -> str:
    return match.group(1) + REDACTED


def redact(text: str) -> str:
    """Replace token shapes and credential ``name: value`` pairs with ``[REDACTED]``.

    >>> redact("token=abc123 failed")
    'token=[REDACTED] failed'
    """
    # Replacing only ever inserts "[REDACTED]", which holds no trigger word and
    # cannot join two pieces of text into one, so the triggers are checked once.
    lowered = text.lower()
    for triggers, pattern, keep_label in _RULES:
        if any(word in lowered for word in triggers):
            text = pattern.sub(_keep_label if keep_label else REDACTED, text)
    return text


def has_token_shape(text: str) -> bool:
    """Whether ``text`` holds a self-identifying token (``sk-``, ``ghp_``, ``AKIA``, a JWT, a
    PEM private key, ...), the shapes :func:`redact` removes whatever labels them.

    >>> has_token_shape("ghp_" + "a" * 36), has_token_shape("C.UTF-8")
    (True, False)
    """
    lowered = text.lower()
    return any(
        pattern.search(text) is not None
        for triggers, pattern, _ in _TOKEN_RULES
        if any(word in lowered for word in triggers)
    )


def _secret_forms(secret: str) -> set[str]:
    """The secret as it reads when encoded whole, each form at least 6 characters."""
    raw = secret.encode("utf-8", "surrogatepass")
    padded = base64.b64encode(raw).decode("ascii")
    forms = {
        secret,
        padded,
        padded.rstrip("="),
        base64.urlsafe_b64encode(raw).decode("ascii").rstrip("="),
        urllib.parse.quote(raw, safe="!*'()"),
        json.dumps(secret, ensure_ascii=False)[1:-1],
        # Python's own JSON encoders escape non-ASCII characters by default.
        json.dumps(secret)[1:-1],
    }
    return {form for form in forms if len(form) >= _MIN_SECRET}


class Redactor:
    """A thread-safe registry of secrets to remove from text, one per backend.

    >>> r = Redactor()
    >>> r.register("hunter2-password")
    >>> r.redact("login with hunter2-password")
    'login with [REDACTED]'

    Registering also covers the secret's base64 (padded and not), base64url,
    percent-encoded and JSON-escaped forms. Secrets shorter than 6 characters are
    ignored: replacing them would mangle ordinary text.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._forms: set[str] = set()
        self._ordered: tuple[str, ...] = ()

    def register(self, secret: str | None) -> None:
        """Remember ``secret`` (and its encodings); ``None`` or short values are ignored."""
        if not secret or len(secret) < _MIN_SECRET:
            return
        forms = _secret_forms(secret)
        with self._lock:
            if forms <= self._forms:
                return
            self._forms |= forms
            self._ordered = tuple(sorted(self._forms, key=len, reverse=True))

    def redact(self, text: str) -> str:
        """Replace every registered form (longest first), then apply :func:`redact`."""
        for form in self._ordered:  # an immutable snapshot, safe without the lock
            if form in text:
                text = text.replace(form, REDACTED)
        return redact(text)

    def appears_in(self, text: str) -> bool:
        """Whether any registered secret, in any of its encodings, occurs in ``text``.

        >>> r = Redactor()
        >>> r.register("s3cr3t-key")
        >>> r.appears_in("prefix-s3cr3t-key"), r.appears_in("C.UTF-8")
        (True, False)
        """
        return any(form in text for form in self._ordered)

    def __repr__(self) -> str:
        return f"Redactor({len(self._forms)} forms)"


def redaction(redactor: Redactor | None) -> Callable[[str], str]:
    """How text is cleaned: by ``redactor`` (its secrets and the shared rules), else by
    the shared rules alone (:func:`redact`)."""
    return redactor.redact if redactor is not None else redact


def redact_value(value: Any, redactor: Redactor | None = None) -> Any:
    """Deep-copy JSON-like ``value`` for display with every secret removed.

    Strings are redacted, bytes become their redacted UTF-8 text, the value of a
    secret-named key (``SECRET_KEY_PATTERN``) that is not ``None`` becomes
    ``[REDACTED]``, sequences become lists, and a reference back to a container
    being copied becomes ``"[Circular]"``::

        >>> redact_value({"apiKey": "k", "maxTokens": 5, "note": ["sk-abcdefgh"]})
        {'apiKey': '[REDACTED]', 'maxTokens': 5, 'note': ['[REDACTED]']}
    """
    return _redact_within(value, redaction(redactor), set())


def _redact_within(value: Any, clean: Callable[[str], str], copying: set[int]) -> Any:
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return clean(bytes(value).decode("utf-8", "replace"))
    if not isinstance(value, (Mapping, list, tuple, set, frozenset)):
        return value
    if id(value) in copying:
        return "[Circular]"
    copying.add(id(value))
    try:
        if isinstance(value, Mapping):
            return {
                key: REDACTED
                if isinstance(key, str) and SECRET_KEY_PATTERN.fullmatch(key) and item is not None
                else _redact_within(item, clean, copying)
                for key, item in value.items()
            }
        return [_redact_within(item, clean, copying) for item in value]
    finally:
        # Only an ancestor is circular; the same object twice side by side is not.
        copying.discard(id(value))
