"""The local service's own certificate authority: HTTPS for ``https://<port>-<id>.localhost``.

The E2B SDKs build a sandbox port's address as ``https://`` + ``get_host(port)``; the
service answers TLS on its own port (see :mod:`piship_remote._http_server.tls_sniff`) with
a certificate its CA signed for the very name the client asked for (its SNI): a wildcard
``*.localhost`` does not validate (a wildcard needs two labels under it), so each name gets
its own leaf, minted on first use and kept for the service's life.

The CA is made once per state directory and kept there (its key ``0600``, outside any
sandbox); clients trust it through the standard variables, pointed at :attr:`ca_path` or
at :attr:`bundle_path` (the CA followed by the default CAs, for a variable that replaces
them)::

    certificates = ServiceCertificates.load(state_dir, work_dir)
    context = certificates.server_context()     # HttpServer(..., sniff_tls=context)
    certificates.bundle_path                    # SSL_CERT_FILE, REQUESTS_CA_BUNDLE
    certificates.ca_path                        # NODE_EXTRA_CA_CERTS
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import re
import ssl
import tempfile
import threading

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError as missing:  # the local extra
    raise ImportError(
        f"HTTPS needs cryptography ({missing}): pip install 'piship-remote[local]'"
    ) from missing

__all__ = [
    "CA_FILE",
    "CA_KEY_FILE",
    "CA_NAME",
    "MAX_LEAVES",
    "ServiceCertificates",
    "default_state_dir",
]

CA_NAME = "piship-remote local service CA"
CA_KEY_FILE = "ca-key.pem"
"""The CA's key and certificate together (``0600``): made once, never rewritten."""
CA_FILE = "ca.pem"
BUNDLE_FILE = "ca-bundle.pem"
MAX_LEAVES = 1024
"""Leaf certificates kept at once; past it the oldest name's is minted again on its next use."""
CA_YEARS = 10
LEAF_DAYS = 397  # the longest validity clients accept for a leaf
SERVED_DOMAIN = "localhost"
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_DEFAULT_NAMES = ("localhost", "127.0.0.1", "::1")


def default_state_dir() -> str:
    """Where the service keeps its CA unless told: ``$XDG_STATE_HOME/piship-remote/local``
    (``~/.local/state/piship-remote/local``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(base, "piship-remote", "local")


class ServiceCertificates:
    """The CA (loaded from, or made in, a state directory) and the leaves it signs."""

    def __init__(
        self,
        ca_key: ec.EllipticCurvePrivateKey,
        ca: x509.Certificate,
        state_dir: str,
        work_dir: str,
    ) -> None:
        self._ca_key = ca_key
        self._ca = ca
        self.ca_path = os.path.join(state_dir, CA_FILE)
        """The CA certificate alone (``NODE_EXTRA_CA_CERTS``, or a client's own trust)."""
        self.bundle_path = os.path.join(state_dir, BUNDLE_FILE)
        """The CA followed by the default CAs (``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``)."""
        self._work_dir = work_dir
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())  # in memory only
        self._lock = threading.Lock()
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._default = self._context_for(list(_DEFAULT_NAMES))

    @classmethod
    def load(cls, state_dir: str, work_dir: str) -> ServiceCertificates:
        """The CA kept in ``state_dir`` (made there on first use), its public files
        written there; ``work_dir`` (the service's own) holds a leaf's file only while it
        is loaded."""
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        os.makedirs(work_dir, mode=0o700, exist_ok=True)
        ca_key, ca = _kept_ca(os.path.join(state_dir, CA_KEY_FILE))
        certificates = cls(ca_key, ca, state_dir, work_dir)
        ca_pem = ca.public_bytes(serialization.Encoding.PEM)
        _replace(certificates.ca_path, ca_pem)
        _replace(certificates.bundle_path, ca_pem + _default_authorities())
        return certificates

    def server_context(self) -> ssl.SSLContext:
        """The server's context: ``localhost`` and loopback addresses by default, and the
        name a client sends (SNI) under ``localhost`` with a leaf of its own."""
        context = self._default
        context.sni_callback = self._choose
        return context

    def _choose(self, tls: ssl.SSLObject, name: str | None, _: ssl.SSLContext) -> None:
        served = _served_name(name)
        if served is not None:
            tls.context = self._leaf_context(served)

    def _leaf_context(self, name: str) -> ssl.SSLContext:
        with self._lock:
            context = self._contexts.pop(name, None)
            if context is None:
                context = self._context_for([name])
                if len(self._contexts) >= MAX_LEAVES:
                    self._contexts.pop(next(iter(self._contexts)))
            self._contexts[name] = context  # most recently used last
            return context

    def _context_for(self, names: list[str]) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.num_tickets = 0  # no resumption: nothing a client could replay is kept
        context.set_alpn_protocols(["http/1.1"])
        leaf = self._leaf(names).public_bytes(serialization.Encoding.PEM)
        # ssl loads a chain from a file only: a private one (0600), gone once loaded
        with tempfile.NamedTemporaryFile("wb", dir=self._work_dir, suffix=".pem") as file:
            file.write(leaf + _private_pem(self._leaf_key))
            file.flush()
            context.load_cert_chain(file.name)
        return context

    def _leaf(self, names: list[str]) -> x509.Certificate:
        now = datetime.datetime.now(datetime.timezone.utc)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._ca.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName(_general_names(names)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(signing=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()),
                critical=False,
            )
            .sign(self._ca_key, hashes.SHA256())
        )


def _served_name(name: str | None) -> str | None:
    """``name`` when it is one this service answers for (``localhost`` or a name under it)."""
    if name is None:
        return None
    name = name.lower().rstrip(".")
    labels = name.split(".")
    if labels[-1] != SERVED_DOMAIN or len(name) > 253:
        return None
    return name if all(_LABEL.fullmatch(label) for label in labels) else None


def _general_names(names: list[str]) -> list[x509.GeneralName]:
    general: list[x509.GeneralName] = []
    for name in names:
        try:
            general.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            general.append(x509.DNSName(name))
    return general


def _usage(*, signing: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signing,
        crl_sign=signing,
        encipher_only=False,
        decipher_only=False,
    )


def _kept_ca(path: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """The CA in ``path``; made and linked into place first when there is none (two
    services starting at once keep the one linked first)."""
    if not os.path.exists(path):
        key, ca = _new_ca()
        pending = f"{path}.{os.getpid()}.{threading.get_ident()}"
        _write_private(pending, _private_pem(key) + ca.public_bytes(serialization.Encoding.PEM))
        try:
            os.link(pending, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(pending)
    with open(path, "rb") as file:
        data = file.read()
    loaded = serialization.load_pem_private_key(data, password=None)
    if not isinstance(loaded, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path} does not hold an EC private key")
    return loaded, x509.load_pem_x509_certificate(data)


def _new_ca() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, f"made {now:%Y-%m-%d %H:%M:%S}Z"),
        ]
    )
    ca = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=365 * CA_YEARS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(signing=True), critical=True)
        .add_extension(
            x509.NameConstraints(permitted_subtrees=_permitted(), excluded_subtrees=None),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, ca


def _permitted() -> list[x509.GeneralName]:
    """What the CA may sign for at all: ``localhost`` and what is under it, and loopback, so
    trusting it trusts nothing else even if its key leaked."""
    return [
        x509.DNSName(SERVED_DOMAIN),
        x509.IPAddress(ipaddress.ip_network("127.0.0.0/8")),
        x509.IPAddress(ipaddress.ip_network("::1/128")),
    ]


def _default_authorities() -> bytes:
    """The CAs a client trusts by default: those requests uses (certifi's), else the
    system's."""
    from requests.utils import DEFAULT_CA_BUNDLE_PATH

    for path in (DEFAULT_CA_BUNDLE_PATH, ssl.get_default_verify_paths().cafile or ""):
        with contextlib.suppress(OSError), open(path, "rb") as file:
            return b"\n" + file.read()
    return b""


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_private(path: str, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)


def _replace(path: str, data: bytes) -> None:
    """Write ``path`` whole, readers seeing the old file or the new, never a part."""
    pending = f"{path}.{os.getpid()}.{threading.get_ident()}"
    with open(pending, "wb") as file:
        file.write(data)
    os.chmod(pending, 0o644)
    os.replace(pending, path)
