"""Redaction: pattern rules, the secret registry and its encodings, deep redaction."""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.parse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from piship_remote.backends._credential import Credential
from piship_remote.model.redact import REDACTED, SECRET_KEY_PATTERN, Redactor, redact, redact_value

# ---------------------------------------------------------------- pattern rules

PATTERN_CASES = [
    # authorization, any scheme or none, label kept
    ("authorization: Bearer abc.def.ghi", "authorization: [REDACTED]"),
    ("Authorization: Basic dXNlcjpwYXNz rest", "Authorization: [REDACTED] rest"),
    ("AUTHORIZATION=Token abc123", "AUTHORIZATION=[REDACTED]"),
    ("authorization: rawcredential", "authorization: [REDACTED]"),
    ('{\\"authorization\\":\\"Token abc\\"}', '{\\"authorization\\":\\"[REDACTED]\\"}'),
    ('{"Authorization": "Bearer xyz"}', '{"Authorization": "[REDACTED]"}'),
    # cookies to the end of the line
    ("Cookie: a=b; session=c\nnext line", "Cookie: [REDACTED]\nnext line"),
    ("set-cookie: id=xyz; Path=/; HttpOnly", "set-cookie: [REDACTED]"),
    # bearer tokens of 8+ characters
    ("got bearer abcdefgh12345678 back", "got [REDACTED] back"),
    ("Bearer abc", "Bearer abc"),
    # Basic credentials that look like base64
    ("Basic dXNlcjpwYXNzd29yZA==", "[REDACTED]"),
    ("BASIC QWxhZGRpbjpvcGVu", "[REDACTED]"),
    ("basic abcdefghijklmnop", "basic abcdefghijklmnop"),
    ("basic authentication required", "basic authentication required"),
    ("Basic abcdefghiJklmnop", "[REDACTED]"),
    # vendor shapes
    ("key sk-abcdef1234 used", "key [REDACTED] used"),
    ("sk-abc", "sk-abc"),
    ("ask-abcdefgh", "ask-abcdefgh"),
    ("ghp_" + "a" * 20, REDACTED),
    ("gho_" + "B" * 25 + " x", REDACTED + " x"),
    ("ghs_short", "ghs_short"),
    ("github_pat_" + "a_b" * 8, REDACTED),
    ("xoxb-1234567890", REDACTED),
    ("xoxp-12345", "xoxp-12345"),
    ("AKIAABCDEFGHIJKLMNOP", REDACTED),
    ("id=ASIA1234567890ABCDEF.", "id=[REDACTED]."),
    ("AKIAABCDEFGHIJKLMNOPQ", "AKIAABCDEFGHIJKLMNOPQ"),
    ("AIza" + "x" * 30, REDACTED),
    ("glpat-" + "x" * 16, REDACTED),
    ("glpat-short", "glpat-short"),
    # JWT shapes, only at the start of a token run
    ("jwt eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.sig", "jwt [REDACTED]"),
    ("eyAAAAAAAAAAAA.eyBBBBBBBBBBBB", REDACTED),
    ("eyJabcdef.ghijkl.", REDACTED),
    ("xeyJabcdef.ghijkl.mno", "xeyJabcdef.ghijkl.mno"),
    # PEM private keys, terminated or running to the end
    (
        "k: -----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY----- done",
        "k: [REDACTED] done",
    ),
    ("-----BEGIN PRIVATE KEY-----\nMIIB...", REDACTED),
    ("-----BEGIN PUBLIC KEY-----\nMIIB", "-----BEGIN PUBLIC KEY-----\nMIIB"),
    # name: value pairs ending in a credential word
    ("token=abc123&next=1", "token=[REDACTED]&next=1"),
    ("X-Api-Key: abcdef", "X-Api-Key: [REDACTED]"),
    ('"client_secret": "s3cr3t"', '"client_secret": "[REDACTED]"'),
    ("secretAccessKey=xyz", "secretAccessKey=[REDACTED]"),
    ("password: hunter2", "password: [REDACTED]"),
    ("passwd=hunter2", "passwd=[REDACTED]"),
    ("credentials = abc", "credentials = [REDACTED]"),
    ("private_key: abc", "private_key: [REDACTED]"),
    ('{\\"api_key\\":\\"abc\\"}', '{\\"api_key\\":\\"[REDACTED]\\"}'),
    ("?access_token=abc,more", "?access_token=[REDACTED],more"),
    # ... but prose labelling a problem keeps its words
    ("sandbox credential: delete ref: failed", "sandbox credential: delete ref: failed"),
    ("credential: the sandbox was gone", "credential: the sandbox was gone"),
    ("secret: revocation: failed", "secret: revocation: failed"),
    ("credential: the", "credential: [REDACTED]"),
    ("token: deleted", "token: [REDACTED]"),
    # ... and code in a hint is not a value
    ("pass credential=lambda: os.environ['E2B_API_KEY']", None),
    ("(credential=lambda:os.environ['K'])", None),
    ("token=lambda_0123456789", "token=[REDACTED]"),
    # ordinary text stays
    ("maxTokens: 5 tokens used", "maxTokens: 5 tokens used"),
    ("the e2b-compatible endpoint health check returned HTTP 503", None),
]


@pytest.mark.parametrize(("text", "expected"), PATTERN_CASES)
def test_pattern_rule(text: str, expected: str | None) -> None:
    assert redact(text) == (text if expected is None else expected)


def test_the_missing_credential_hint_survives_redaction() -> None:
    error = Credential(lambda: None, None, Redactor(), name="E2B_API_KEY", required=True).missing()
    assert error is not None and error.user_action is not None
    assert REDACTED not in error.user_action
    assert "credential=lambda: os.environ['E2B_API_KEY']" in error.user_action


def test_redact_leaves_text_without_secrets_unchanged() -> None:
    text = "HTTP 503: service unavailable (try again later)"
    assert redact(text) == text


def test_a_non_ascii_letter_does_not_shield_a_token() -> None:
    assert redact("ésk-abcdefgh") == "é" + REDACTED


ADVERSARIAL = [
    "a" * 1_000_000,
    "ey-" * 333_334,
    "eyJ" + "a" * 999_997,
    "sk-" * 333_334,
    "Basic " + "a" * 999_994,
    "token= " * 142_858,
    "authorization: " * 66_667,
    "-----BEGIN " * 90_910,
    "-----BEGIN RSA PRIVATE KEY-----" + "A" * 999_969,
    "cookie: \\" * 100_000,
    "bearer " * 142_858,
    "password=" + "\\a" * 499_995,
    "é" * 1_000_000,
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("text", ADVERSARIAL, ids=lambda text: repr(text[:12]))
def test_redact_is_linear_on_a_megabyte(text: str) -> None:
    started = time.perf_counter()
    redact(text)
    assert time.perf_counter() - started < 2.0


# ---------------------------------------------------------------- the registry


def encodings(secret: str) -> list[str]:
    """The encoded forms the registry must cover, computed independently."""
    raw = secret.encode()
    return [
        secret,
        base64.b64encode(raw).decode(),
        base64.b64encode(raw).decode().rstrip("="),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
        urllib.parse.quote(secret, safe="-_.!~*'()"),
        json.dumps(secret, ensure_ascii=False)[1:-1],
    ]


@pytest.fixture
def redactor() -> Redactor:
    return Redactor()


SECRET = 'k3y/with+"odd" chars?\n'


@pytest.mark.parametrize("form", encodings(SECRET))
def test_registered_secret_is_removed_in_each_encoding(redactor: Redactor, form: str) -> None:
    redactor.register(SECRET)
    assert redactor.redact(f"HTTP 401: bad key <{form}>") == f"HTTP 401: bad key <{REDACTED}>"


def test_encodings_of_the_test_secret_differ() -> None:
    assert len(set(encodings(SECRET))) == 6


def test_base64url_form_is_covered(redactor: Redactor) -> None:
    secret = "\xff\xfe??>>"  # base64 has + and /, base64url has - and _
    form = base64.urlsafe_b64encode(secret.encode()).decode().rstrip("=")
    assert "-" in form or "_" in form
    redactor.register(secret)
    assert form not in redactor.redact(f"x{form}x")


def test_python_json_escaped_form_is_covered(redactor: Redactor) -> None:
    secret = "clé-secrète-1"
    redactor.register(secret)
    assert redactor.redact(json.dumps({"k": secret})) == '{"k": "[REDACTED]"}'


@pytest.mark.parametrize("secret", [None, "", "abc", "abcde"])
def test_short_or_missing_secrets_are_ignored(redactor: Redactor, secret: str | None) -> None:
    redactor.register(secret)
    assert redactor.redact("abcde abc") == "abcde abc"


def test_six_character_secret_is_registered(redactor: Redactor) -> None:
    redactor.register("abcdef")
    assert redactor.redact("xabcdefx") == f"x{REDACTED}x"


def test_short_encoded_forms_are_not_kept(redactor: Redactor) -> None:
    redactor.register("abcdef")
    # the 8-char base64 form "YWJjZGVm" is kept; nothing shorter than 6 chars is
    assert redactor.redact("YWJjZGVm") == REDACTED
    assert redactor.redact("abcde") == "abcde"


def test_longest_secret_is_replaced_first(redactor: Redactor) -> None:
    redactor.register("secret")
    redactor.register("secret-and-more")
    assert redactor.redact("a secret-and-more b") == f"a {REDACTED} b"


def test_redactor_applies_pattern_rules_too(redactor: Redactor) -> None:
    assert redactor.redact("Authorization: Bearer abcdefgh") == "Authorization: [REDACTED]"


def test_redactors_are_independent() -> None:
    first, second = Redactor(), Redactor()
    first.register("only-in-first")
    assert second.redact("only-in-first") == "only-in-first"


def test_registering_twice_is_harmless(redactor: Redactor) -> None:
    redactor.register("twice-secret")
    redactor.register("twice-secret")
    assert redactor.redact("twice-secret") == REDACTED


@pytest.mark.timeout(30)
def test_registry_is_thread_safe(redactor: Redactor) -> None:
    secrets = [f"thread-secret-{i:04d}" for i in range(400)]
    start = threading.Event()
    failures: list[str] = []

    def register(chunk: list[str]) -> None:
        start.wait()
        for secret in chunk:
            redactor.register(secret)
            if secret in redactor.redact(f"<{secret}>"):
                failures.append(secret)

    threads = [
        threading.Thread(target=register, args=(secrets[i::4],), name=f"piship-test-{i}")
        for i in range(4)
    ]
    for thread in threads:
        thread.start()
    start.set()
    for thread in threads:
        thread.join()
    assert failures == []
    text = " ".join(secrets)
    assert redactor.redact(text) == " ".join([REDACTED] * len(secrets))


_SAFE = st.characters(codec="utf-8", exclude_characters="[]")


@settings(max_examples=200, deadline=None)
@given(
    secret=st.text(alphabet=_SAFE, min_size=6, max_size=40),
    before=st.text(alphabet=_SAFE, max_size=40),
    after=st.text(alphabet=_SAFE, max_size=40),
    which=st.integers(min_value=0, max_value=5),
)
def test_registered_secret_never_survives_in_any_encoding(
    secret: str, before: str, after: str, which: int
) -> None:
    redactor = Redactor()
    redactor.register(secret)
    forms = [form for form in encodings(secret) if len(form) >= 6]
    output = redactor.redact(before + forms[which % len(forms)] + after)
    # Read between the markers: a secret such as "REDACT" is part of the marker itself.
    for piece in output.split(REDACTED):
        for form in forms:
            assert form not in piece


# ---------------------------------------------------------------- deep redaction


@pytest.mark.parametrize(
    "key",
    [
        "token",
        "Token",
        "apiToken",
        "auth_token",
        "x-api-token",
        "X_Session-Token",
        "accessToken",
        "refresh_token",
        "id-token",
        "bearer_token",
        "csrfToken",
        "xsrf-token",
        "credential",
        "secret",
        "client_secret",
        "clientSecret",
        "client-secret",
        "api_key",
        "apiKey",
        "x-api-key",
        "private_key",
        "privateKey",
        "password",
        "passwd",
        "authorization",
        "Proxy-Authorization",
        "cookie",
        "Set-Cookie",
        "bearer",
    ],
)
def test_secret_named_key_is_redacted_whole(key: str) -> None:
    assert redact_value({key: {"nested": 1}}) == {key: REDACTED}


@pytest.mark.parametrize("key", ["maxTokens", "tokens", "credentials", "secretary", "keys"])
def test_other_keys_are_kept(key: str) -> None:
    assert redact_value({key: 5}) == {key: 5}


def test_secret_key_pattern_needs_a_whole_match() -> None:
    assert SECRET_KEY_PATTERN.fullmatch("x_api_key")
    assert not SECRET_KEY_PATTERN.fullmatch("my_api_key")


def test_secret_named_key_with_null_value_stays_null() -> None:
    assert redact_value({"token": None}) == {"token": None}


def test_redact_value_walks_containers() -> None:
    detail = {
        "adapter": "e2b",
        "errors": ("Bearer abcdefgh1234", b"sk-abcdefgh"),
        "count": 3,
        "ok": True,
        "nothing": None,
    }
    assert redact_value(detail) == {
        "adapter": "e2b",
        "errors": [REDACTED, REDACTED],
        "count": 3,
        "ok": True,
        "nothing": None,
    }


def test_redact_value_does_not_change_its_input() -> None:
    detail = {"token": "abc", "list": ["sk-abcdefgh"]}
    redact_value(detail)
    assert detail == {"token": "abc", "list": ["sk-abcdefgh"]}


def test_redact_value_marks_circular_references() -> None:
    detail: dict[str, object] = {"name": "x"}
    detail["self"] = detail
    assert redact_value(detail) == {"name": "x", "self": "[Circular]"}


def test_redact_value_copies_a_repeated_sibling() -> None:
    shared = ["a"]
    assert redact_value({"one": shared, "two": shared}) == {"one": ["a"], "two": ["a"]}


def test_redact_value_uses_the_redactor(redactor: Redactor) -> None:
    redactor.register("registered-key")
    assert redact_value(["registered-key"], redactor) == [REDACTED]
