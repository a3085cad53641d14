"""Certificates and keys for the kube-apiserver, made with ``cryptography`` (no openssl, no cfssl).

Two CAs, as in envtest: one signs the apiserver's serving certificate, the other signs client
certificates (the admin's carries ``O=system:masters``, which RBAC lets do anything). The service
account signing key pair is separate: the apiserver signs and checks tokens with it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class Pki:
    dir: Path

    @property
    def serving_ca(self) -> Path:
        return self.dir / "serving-ca.crt"

    @property
    def apiserver_cert(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def client_ca(self) -> Path:
        return self.dir / "client-ca.crt"

    @property
    def client_ca_key(self) -> Path:
        return self.dir / "client-ca.key"

    @property
    def admin_cert(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    @property
    def kueue_webhook_cert(self) -> Path:
        """Kueue's webhook serving certificate (SAN 127.0.0.1), signed by the serving CA."""
        return self.dir / "kueue-webhook.crt"

    @property
    def kueue_webhook_key(self) -> Path:
        return self.dir / "kueue-webhook.key"


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write(path: Path, data: bytes, private: bool) -> None:
    path.write_bytes(data)
    os.chmod(path, 0o600 if private else 0o644)


def _ca(cn: str, now: dt.datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    cn: str,
    now: dt.datetime,
    *,
    orgs: tuple[str, ...] = (),
    server_names: tuple[str, ...] = (),
    server_ips: tuple[str, ...] = (),
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    server = bool(server_names or server_ips)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn, orgs))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                key_cert_sign=False,
                crl_sign=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if server:
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in server_ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def generate(directory: Path) -> Pki:
    """Write a fresh PKI into ``directory`` (keys mode 0600) and return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    now = dt.datetime.now(dt.timezone.utc)

    serving_ca_key, serving_ca = _ca("gpu-auditor-testbed-serving-ca", now)
    api_key, api_cert = _leaf(
        serving_ca_key,
        serving_ca,
        "kube-apiserver",
        now,
        server_names=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        server_ips=("127.0.0.1", "10.0.0.1"),
    )
    client_ca_key, client_ca = _ca("gpu-auditor-testbed-client-ca", now)
    admin_key, admin_cert = _leaf(client_ca_key, client_ca, "admin", now, orgs=("system:masters",))
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    kueue_key, kueue_cert = _leaf(
        serving_ca_key, serving_ca, "kueue-webhook", now, server_names=("localhost",), server_ips=("127.0.0.1",)
    )

    _write(pki.serving_ca, _pem_cert(serving_ca), private=False)
    _write(pki.apiserver_cert, _pem_cert(api_cert) + _pem_cert(serving_ca), private=False)
    _write(pki.apiserver_key, _pem_key(api_key), private=True)
    _write(pki.client_ca, _pem_cert(client_ca), private=False)
    _write(pki.client_ca_key, _pem_key(client_ca_key), private=True)
    _write(pki.admin_cert, _pem_cert(admin_cert), private=False)
    _write(pki.admin_key, _pem_key(admin_key), private=True)
    _write(pki.sa_key, _pem_key(sa_key), private=True)
    _write(pki.kueue_webhook_cert, _pem_cert(kueue_cert) + _pem_cert(serving_ca), private=False)
    _write(pki.kueue_webhook_key, _pem_key(kueue_key), private=True)
    _write(
        pki.sa_pub,
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
        private=False,
    )
    return pki
