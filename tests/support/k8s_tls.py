"""A throw-away certificate authority for TLS tests: a server certificate for loopback
and a client certificate.

    pki = Pki.create(tmp_path)
    with KubernetesServer(cluster=cluster, tls=pki.server_context()) as mock:
        ...
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CLIENT_NAME = "piship-user"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _issue(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common: str,
    usage: x509.ObjectIdentifier,
    names: list[x509.GeneralName],
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A day-long leaf certificate for ``common`` signed by the CA, and its key."""
    key = _key()
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


@attrs.frozen
class Pki:
    """PEM files: the CA, the server's pair (127.0.0.1, ::1, localhost), a client pair."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    ca_key: Path

    @classmethod
    def create(cls, directory: Path) -> Pki:
        now = datetime.datetime.now(datetime.timezone.utc)
        ca_key = _key()
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(_name("piship test CA"))
            .issuer_name(_name("piship test CA"))
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )

        server_cert, server_key = _issue(
            ca_cert,
            ca_key,
            "127.0.0.1",
            ExtendedKeyUsageOID.SERVER_AUTH,
            [
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("::1")),
                x509.DNSName("localhost"),
            ],
        )
        client_cert, client_key = _issue(
            ca_cert, ca_key, CLIENT_NAME, ExtendedKeyUsageOID.CLIENT_AUTH, []
        )
        pki = cls(
            ca=directory / "ca.crt",
            server_cert=directory / "server.crt",
            server_key=directory / "server.key",
            client_cert=directory / "client.crt",
            client_key=directory / "client.key",
            ca_key=directory / "ca.key",
        )
        pem = serialization.Encoding.PEM
        pki.ca.write_bytes(ca_cert.public_bytes(pem))
        pki.server_cert.write_bytes(server_cert.public_bytes(pem))
        _write_key(pki.server_key, server_key)
        pki.client_cert.write_bytes(client_cert.public_bytes(pem))
        _write_key(pki.client_key, client_key)
        _write_key(pki.ca_key, ca_key)
        return pki

    def another_client(self, common: str) -> tuple[Path, Path]:
        """A second client pair from the same CA, named ``common`` (PEM files beside it)."""
        ca_cert = x509.load_pem_x509_certificate(self.ca.read_bytes())
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        cert, key = _issue(ca_cert, ca_key, common, ExtendedKeyUsageOID.CLIENT_AUTH, [])
        cert_path = self.ca.parent / f"{common}.crt"
        key_path = self.ca.parent / f"{common}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key_path, key)
        return cert_path, key_path

    def server_context(self) -> ssl.SSLContext:
        """The server's context: it verifies a client certificate when one is presented."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server_cert, self.server_key)
        context.load_verify_locations(self.ca)
        context.verify_mode = ssl.CERT_OPTIONAL
        return context
