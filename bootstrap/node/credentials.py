"""The node's credentials on disk: its key, its CSR, and the checked answer written out.

The node key (ECDSA P-256, ``node.key``) stays on the node; the server only sees a CSR for it.
What the server returns is checked before anything is written: the SVID certifies this node's
key, names the SPIFFE ID of the answer and chains to the returned bundle; the kubelet client
certificate certifies the same key. Every file is written atomically with mode 0600, and one join
or renewal at a time works in a folder (docs/node-join.md).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import fcntl
import hmac
import json
import logging
import os
import stat
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import NameOID

from attest import svid as svidlib
from attest import x509pop
from attest.errors import AttestationError
from bootstrap.files import read_limited, write_atomic
from bootstrap.node.client import JOIN_FINISH_PATH
from bootstrap.node.errors import JoinFailed, one_line
from bootstrap.protocol import FinishResponse
from bootstrap.times import parse_time

__all__ = [
    "BUNDLE_FILE",
    "INDEX_FILE",
    "KEY_FILE",
    "KUBECONFIG_FILE",
    "MAX_KEY_FILE",
    "SVID_FILE",
    "X509POP_FILE",
    "bad_response",
    "checked_credentials",
    "folder_lock",
    "index_json",
    "key_pem",
    "kubeconfig_with_key",
    "node_csr",
    "node_key",
    "read_node_key",
    "same_key",
    "write_files",
]

# The join's logger: these steps are the same for join and renew, and say so under one name.
log = logging.getLogger("nodegate.join")

MAX_KEY_FILE = 64 * 1024
KEY_FILE = "node.key"
SVID_FILE = "svid.pem"
BUNDLE_FILE = "bundle.pem"
KUBECONFIG_FILE = "kubelet.kubeconfig"
INDEX_FILE = "join.json"
# Certificate and key in one file, so the pair is replaced in one rename: spire-agent's x509pop
# private_key_path and certificate_path both name it (docs/spire.md).
X509POP_FILE = "x509pop.pem"


# -- node key and CSR ---------------------------------------------------------------------------


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _spki(public: PublicKeyTypes) -> bytes:
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def read_node_key(path: Path, unusable: str) -> ec.EllipticCurvePrivateKey | None:
    """The P-256 key at ``path`` (narrowed to mode 0600), or None when there is none or it is not
    one (logged with ``unusable``)."""
    try:
        data = read_limited(path, MAX_KEY_FILE)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise JoinFailed("file_error", f"cannot read {path}: {exc}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        key = None  # details could quote key material
    if not (isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1)):
        log.warning("%s is not an unencrypted ECDSA P-256 PEM key; %s", path, unusable)
        return None
    try:
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            log.warning("%s was readable by others; setting mode 0600", path)
            path.chmod(0o600)
    except OSError as exc:
        raise JoinFailed("file_error", f"cannot restrict {path} to mode 0600: {exc}") from None
    return key


def node_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """The existing P-256 key at ``path`` (a re-join keeps it), else a new one written there."""
    existing = read_node_key(path, "generating a new node key")
    if existing is not None:
        return existing
    key = ec.generate_private_key(ec.SECP256R1())
    try:
        write_atomic(path, key_pem(key))
    except OSError as exc:
        raise JoinFailed("file_error", f"cannot write {path}: {exc}") from None
    return key


def node_csr(key: ec.EllipticCurvePrivateKey, node_name: str) -> x509.CertificateSigningRequest:
    # Kubelet client CSR rules: exactly O=system:nodes and CN=system:node:<name>, no SANs.
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}"),
        ]
    )
    return x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())


# -- checking the answer ------------------------------------------------------------------------


def bad_response(detail: str, where: str = JOIN_FINISH_PATH) -> JoinFailed:
    """A final refusal of the server's answer (exit 1): retrying would get the same answer."""
    return JoinFailed("bad_response", f"{where}: {detail}")


def same_key(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> bool:
    return hmac.compare_digest(_spki(cert.public_key()), _spki(key.public_key()))


def _check_svid(fin: FinishResponse, key: ec.EllipticCurvePrivateKey, where: str) -> list[x509.Certificate]:
    """The SVID certifies the node key and chains to the returned bundle; returns the roots."""
    try:
        chain = x509.load_pem_x509_certificates(fin.svid.encode("utf-8"))
        roots = x509.load_pem_x509_certificates(fin.bundle.encode("utf-8"))
    except ValueError:
        raise bad_response("svid or bundle is not PEM certificates", where) from None
    leaf = chain[0]
    if not same_key(leaf, key):
        raise bad_response("the SVID certifies another key than this node's key", where)
    try:
        sid = svidlib.parse_spiffe_id(fin.spiffe_id)
        # Judge the chain at a moment inside the leaf's validity: a freshly booted node's clock
        # may be far off, and freshness is the server's business; the signature chain is ours.
        now = min(max(datetime.now(UTC), leaf.not_valid_before_utc), leaf.not_valid_after_utc)
        got = svidlib.verify_svid(leaf, roots=roots, trust_domain=sid.trust_domain, now=now, usage="client")
    except svidlib.SpiffeIdError as exc:
        raise bad_response(f"spiffe_id is invalid: {exc}", where) from None
    except AttestationError as exc:
        raise bad_response(
            f"the SVID does not verify against the returned bundle: {exc.detail}", where
        ) from None
    if got != sid:
        raise bad_response(f"the SVID names {got}, the answer says {sid}", where)
    return roots


def checked_credentials(
    fin: FinishResponse, key: ec.EllipticCurvePrivateKey, node_name: str, where: str
) -> dict[str, bytes]:
    """svid.pem and bundle.pem (and x509pop.pem when the answer has one) from an answer that
    names this node and certifies ``key``."""
    if fin.node_name != node_name:
        raise bad_response(f"answer is for node {one_line(fin.node_name, 80)!r}, not {node_name!r}", where)
    if parse_time(fin.svid_expires_at) is None:
        raise bad_response("svid_expires_at is not an RFC 3339 timestamp with a time zone", where)
    roots = _check_svid(fin, key, where)
    files = {SVID_FILE: fin.svid.encode("utf-8"), BUNDLE_FILE: svidlib.bundle_pem(roots)}
    if fin.x509pop_certificate is not None:
        files[X509POP_FILE] = _x509pop_file(fin.x509pop_certificate, key, roots, node_name, where)
    return files


def _x509pop_file(
    pem: str, key: ec.EllipticCurvePrivateKey, roots: list[x509.Certificate], node_name: str, where: str
) -> bytes:
    """The x509pop certificate checked as SPIRE will use it (this node's key, signed by a root of
    the bundle, digitalSignature, not a CA, naming this node), followed by the key."""
    try:
        certs = x509.load_pem_x509_certificates(pem.encode("utf-8"))
    except ValueError:
        raise bad_response("x509pop_certificate is not a PEM certificate", where) from None
    cert = certs[0]
    if len(certs) != 1 or not same_key(cert, key):
        raise bad_response("x509pop_certificate must be one certificate for this node's key", where)
    if not any(_issued_by(cert, root) for root in roots):
        raise bad_response("x509pop_certificate is not signed by a root of the returned bundle", where)
    try:
        ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
        bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except (x509.ExtensionNotFound, ValueError):
        raise bad_response("x509pop_certificate lacks keyUsage or basicConstraints", where) from None
    if not ku.digital_signature or bc.ca:
        raise bad_response("x509pop_certificate must allow digitalSignature and not be a CA", where)
    facts = [v for k, v in _x509pop_facts(cert).items() if k == x509pop.NODE]
    if facts != [node_name]:
        raise bad_response(f"x509pop_certificate does not name node {node_name}", where)
    return cert.public_bytes(serialization.Encoding.PEM) + key_pem(key)


def _x509pop_facts(cert: x509.Certificate) -> dict[str, str]:
    # Any trust domain: SPIRE's may differ from nodegate's, and the node does not know it.
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (x509.ExtensionNotFound, ValueError):
        return {}
    for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.startswith(x509pop.SCHEME):
            return x509pop.selectors(cert, uri[len(x509pop.SCHEME) :].split("/", 1)[0])
    return {}


def _issued_by(cert: x509.Certificate, root: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(root)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _b64_pem(value: object) -> bytes:
    if not isinstance(value, str):
        raise ValueError("must be a base64 string")  # noqa: TRY004  (the caller catches ValueError)
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        raise ValueError("is not standard base64") from None


def kubeconfig_with_key(text: str, key: ec.EllipticCurvePrivateKey) -> bytes:
    """The server's kubeconfig has the client certificate only; the key never left the node."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        raise bad_response("kubeconfig is not YAML") from None
    users = doc.get("users") if isinstance(doc, dict) else None
    if not isinstance(users, list) or not users or not isinstance(users[0], dict):
        raise bad_response("kubeconfig has no users")
    user = users[0].get("user")
    if not isinstance(user, dict):
        raise bad_response("kubeconfig users[0] has no user")
    cert_data = user.get("client-certificate-data")
    if cert_data is not None:
        try:
            cert = x509.load_pem_x509_certificates(_b64_pem(cert_data))[0]
        except ValueError:
            raise bad_response("kubeconfig client-certificate-data is not a base64 PEM certificate") from None
        if not same_key(cert, key):
            raise bad_response("the kubelet client certificate certifies another key than this node's key")
    user["client-key-data"] = base64.b64encode(key_pem(key)).decode("ascii")
    return yaml.safe_dump(doc, sort_keys=False).encode("utf-8")


# -- writing it ---------------------------------------------------------------------------------


def index_json(fin: FinishResponse) -> bytes:
    """``join.json``: written last, so its presence means the set beside it is complete."""
    index = {"node_name": fin.node_name, "spiffe_id": fin.spiffe_id, "svid_expires_at": fin.svid_expires_at}
    return (json.dumps(index, indent=2, sort_keys=True) + "\n").encode("utf-8")


def write_files(folder: Path, files: Mapping[str, bytes]) -> dict[str, Path]:
    """Each file atomically (0600), in the order given."""
    written: dict[str, Path] = {}
    for name, data in files.items():
        try:
            write_atomic(folder / name, data)
        except OSError as exc:
            raise JoinFailed("file_error", f"cannot write {folder / name}: {exc}") from None
        written[name] = folder / name
    return written


@contextlib.asynccontextmanager
async def folder_lock(folder: Path) -> AsyncIterator[None]:
    """One join or renewal at a time per folder (a flock on the folder itself, so no lock file):
    the node key and its SVID are replaced as a pair, and a second writer would tear it."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise JoinFailed("file_error", f"cannot open {folder}: {exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("waiting for another nodegate join or renew to finish with %s", folder)
            await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
