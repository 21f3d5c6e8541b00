"""TLS for the control plane: the server's certificate (given, or self-signed for a proof of
concept) and the trust file clients and jobs verify it with."""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import socket
import ssl
from pathlib import Path
from typing import NamedTuple

from deeppod.atomic import atomic_write
from deeppod.errors import InvalidRequest

log = logging.getLogger(__name__)

SELF_SIGNED = "self-signed"


class Served(NamedTuple):
    cert: Path
    key: Path
    trust: Path | None  # the file clients and jobs verify with; None: the system's trust store


def self_signed(folder: Path, hosts: list[str], days: int = 825) -> tuple[Path, Path]:
    """A key and a certificate for ``hosts`` (names and addresses) in ``folder``; made once and
    reused while it covers the same hosts and has a month left."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    wanted = sorted(set(hosts))
    if cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        covered = sorted({*names.get_values_for_type(x509.DNSName),
                          *(str(a) for a in names.get_values_for_type(x509.IPAddress))})
        left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
        if covered == wanted and left > datetime.timedelta(days=30):
            return cert_path, key_path
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = []
    for h in wanted:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            alt.append(x509.DNSName(h))
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"DeepPod server {socket.gethostname()}")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    atomic_write(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
    # whole or not at all: a client or job may read it while the server starts
    atomic_write(cert_path, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    log.info("made a self-signed certificate for %s in %s", ", ".join(wanted), folder)
    return cert_path, key_path


def prepare(home: Path, cert: str, key: str, ca: str, hosts: list[str]) -> Served:
    """The certificate and key to serve with, checked, and the trust file (a copy of the CA, or
    of the self-signed certificate) that clients and jobs verify the server with; None when
    the system's trust store does (a certificate from a public CA)."""
    folder = home / "tls"
    trust = folder / "trust" / "ca.pem"  # the one folder of home a sandboxed job sees
    if cert == SELF_SIGNED:
        cert_path, key_path = self_signed(folder, hosts)
        ca = str(cert_path)
    else:
        if not key:
            raise InvalidRequest("--tls-cert needs --tls-key (the certificate's private key), or use --tls-self-signed")
        cert_path, key_path = Path(cert).expanduser(), Path(key).expanduser()
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert_path, key_path)
    except FileNotFoundError as exc:
        raise InvalidRequest(f"cannot read {exc.filename}: give an existing PEM file") from None
    except ssl.SSLError as exc:
        raise InvalidRequest(f"{cert_path} and {key_path} are not a PEM certificate and its key "
                             f"({exc.reason})") from None
    if not ca:
        return Served(cert_path, key_path, None)
    trust.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(trust.parent, 0o755)
    # renamed into place whole: a reader (a client, a job, a second server starting) never sees
    # it half copied, which is what an empty trust file looks like to ssl ("no certificate found")
    atomic_write(trust, Path(ca).read_bytes(), mode=0o644)
    return Served(cert_path, key_path, trust)

