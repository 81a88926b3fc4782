"""Well-known secret files a push leaves at home unless the caller names them.

    secret_reason(".env", "/src/app/.env", is_dir=False)          # "secret file"
    secret_reason(".aws", "/src/app/.aws", is_dir=True)           # "secret folder"
    secret_reason("src/main.py", "/src/app/src/main.py", False)   # None

Files: ``.env`` and ``.env.*`` (not the templates ``.env.example``, ``.sample``,
``.template``, ``.dist``), private keys (``id_rsa``, ``id_ed25519``…, ``*.key``,
``*.p12``, ``*.pfx``, and ``*.pem`` unless it holds certificates and no private key, as a
CA bundle such as certifi's ``cacert.pem`` does), ``.netrc``, ``.git-credentials``,
``.pgpass``, and ``.npmrc`` / ``.pypirc`` when they hold a token or password. Folders: ``.aws``,
``.azure``, ``.config/gcloud``, ``.ssh``, ``.gnupg``, ``.kube``.
"""

from __future__ import annotations

import fnmatch
import re

__all__ = ["SECRET_FILE", "SECRET_FOLDER", "secret_reason"]

SECRET_FILE = "secret file"
SECRET_FOLDER = "secret folder"

_FOLDERS = (".aws", ".azure", ".config/gcloud", ".ssh", ".gnupg", ".kube")
_NAMES = frozenset(
    {
        ".env",
        ".netrc",
        "_netrc",
        ".git-credentials",
        ".pgpass",
        "id_rsa",
        "id_dsa",
        "id_ecdsa",
        "id_ed25519",
        "id_ecdsa_sk",
        "id_ed25519_sk",
    }
)
_PATTERNS = (".env.*", "*.key", "*.p12", "*.pfx")
_PEM = ".pem"
_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
_PRIVATE_KEY = b"PRIVATE KEY-----"  # BEGIN PRIVATE KEY, RSA/EC/OPENSSH/ENCRYPTED PRIVATE KEY
_PEM_READ = 16 * 1024 * 1024  # a larger .pem is kept home unread
_TEMPLATES = (".example", ".sample", ".template", ".dist")
# A credential line in .npmrc (``//registry/:_authToken=…``, ``_auth``, ``_password``)
# or .pypirc (``password = …``).
_TOKENS = {
    ".npmrc": re.compile(rb"(?im)^\s*[^#;\s]*(_authToken|_auth|_password)\s*="),
    ".pypirc": re.compile(rb"(?im)^\s*password\s*[=:]"),
}
_TOKEN_FILE_READ = 1024 * 1024


def secret_reason(relative: str, absolute: str, *, is_dir: bool) -> str | None:
    """``"secret file"``/``"secret folder"`` when the path at ``relative`` (``/``-separated,
    below the workspace) is a well-known secret, else ``None``."""
    if is_dir:
        return SECRET_FOLDER if _is_secret_folder(relative) else None
    name = relative.rpartition("/")[2]
    if name in _NAMES or _secret_pattern(name):
        return SECRET_FILE
    if name.endswith(_PEM) and not _only_certificates(absolute):
        return SECRET_FILE
    token = _TOKENS.get(name)
    if token is not None and _holds(absolute, token):
        return SECRET_FILE
    return None


def _is_secret_folder(relative: str) -> bool:
    return any(relative == folder or relative.endswith("/" + folder) for folder in _FOLDERS)


def _secret_pattern(name: str) -> bool:
    if name.startswith(".env.") and name.endswith(_TEMPLATES):
        return False
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in _PATTERNS)


def _only_certificates(path: str) -> bool:
    """Whether a ``.pem`` holds certificates (public) and no private key."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_PEM_READ + 1)
    except OSError:
        return False  # unreadable: not sent, rather than sent unchecked
    if len(data) > _PEM_READ:
        return False
    return _CERTIFICATE in data and _PRIVATE_KEY not in data


def _holds(path: str, pattern: re.Pattern[bytes]) -> bool:
    try:
        with open(path, "rb") as handle:
            return pattern.search(handle.read(_TOKEN_FILE_READ)) is not None
    except OSError:
        return True  # unreadable: not sent, rather than sent unchecked
