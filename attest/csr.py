"""The node's PKCS#10 CSR: one PEM block, a good key, a valid self-signature, the kubelet subject.

The same CSR goes to the Kubernetes CSR API for the kubelet client certificate, so it must meet
the kubelet rules exactly (the kube-apiserver-client-kubelet signer's rules): subject ``O=system:nodes`` and
``CN=system:node:<node_name>`` and nothing else, no SANs. Its key becomes the SVID key too.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from attest.errors import CsrInvalid

MAX_CSR_PEM = 16 * 1024
MAX_RSA_BITS = 8192  # as Go's crypto/tls, which the kubelet uses
_PEM = re.compile(
    r"-----BEGIN CERTIFICATE REQUEST-----\r?\n([A-Za-z0-9+/=\r\n]+?)-----END CERTIFICATE REQUEST-----\r?\n?"
)
_CURVES = (ec.SECP256R1, ec.SECP384R1)

CsrKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey


@dataclass(frozen=True, slots=True)
class NodeCsr:
    der: bytes
    pem: bytes  # canonical PEM of ``der`` (what goes to the Kubernetes CSR API)
    public_key: CsrKey


def parse_node_csr(pem: object, node_name: str) -> NodeCsr:
    """Check the CSR for ``node_name``; raises CsrInvalid (code ``csr_invalid``)."""
    if not isinstance(pem, str):
        raise CsrInvalid("csr must be a PEM string")
    if len(pem) > MAX_CSR_PEM:
        raise CsrInvalid(f"csr is larger than {MAX_CSR_PEM} bytes")
    m = _PEM.fullmatch(pem.strip() + "\n")
    if m is None:
        raise CsrInvalid("csr must be exactly one PEM 'CERTIFICATE REQUEST' block and nothing else")
    try:
        der = base64.b64decode("".join(m.group(1).split()), validate=True)
        csr = x509.load_der_x509_csr(der)
    except (binascii.Error, ValueError, x509.InvalidVersion):
        raise CsrInvalid("csr is not a DER PKCS#10 request") from None
    if csr.public_bytes(Encoding.DER) != der:
        raise CsrInvalid("csr has trailing or non-canonical bytes")
    # The signature BIT STRING ends the DER; unused bits would make Go (the API server) read a
    # different signature than the one cryptography verifies.
    if der[-len(csr.signature) - 1] != 0:
        raise CsrInvalid("csr signature BIT STRING is not octet-aligned")
    try:
        key = csr.public_key()
    except (ValueError, TypeError, UnsupportedAlgorithm):  # unknown key algorithm or curve
        raise CsrInvalid("csr key is not supported") from None
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, _CURVES):
            raise CsrInvalid(f"csr key curve {key.curve.name} is not P-256 or P-384")
    elif isinstance(key, rsa.RSAPublicKey):
        if key.key_size < 2048:
            raise CsrInvalid(f"csr RSA key has {key.key_size} bits; at least 2048 are needed")
        if key.key_size > MAX_RSA_BITS:  # bigger CSRs overflow the session token (and cost CPU)
            raise CsrInvalid(f"csr RSA key has {key.key_size} bits; at most {MAX_RSA_BITS} are allowed")
    else:
        raise CsrInvalid("csr key must be ECDSA (P-256, P-384) or RSA (>= 2048 bits)")
    if not csr.is_signature_valid:
        raise CsrInvalid("csr self-signature does not verify")
    # cryptography parses these lazily, so malformed contents only fail on access.
    try:
        subject, extensions, attributes = csr.subject, csr.extensions, csr.attributes
    except (ValueError, x509.DuplicateExtension):
        raise CsrInvalid("csr subject, extensions or attributes do not parse") from None
    _check_subject(subject, node_name)
    if len(extensions) > 0:
        names = ", ".join(e.oid.dotted_string for e in extensions)
        raise CsrInvalid(f"csr must carry no extensions (SANs are not allowed in kubelet CSRs): {names}")
    if len(attributes) > 0:
        raise CsrInvalid("csr must carry no attributes")
    return NodeCsr(der, _pem(der), key)


def _check_subject(subject: x509.Name, node_name: str) -> None:
    attrs = [(a.oid, a.value) for rdn in subject.rdns for a in rdn]
    want = {(NameOID.ORGANIZATION_NAME, "system:nodes"), (NameOID.COMMON_NAME, f"system:node:{node_name}")}
    if len(attrs) != 2 or set(attrs) != want:
        raise CsrInvalid(
            f"csr subject must be exactly CN=system:node:{node_name}, O=system:nodes; "
            f"got {subject.rfc4514_string()!r}"[:300]
        )


def _pem(der: bytes) -> bytes:
    body = base64.encodebytes(der).decode().replace("\n", "")
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    text = "\n".join(["-----BEGIN CERTIFICATE REQUEST-----", *lines, "-----END CERTIFICATE REQUEST-----", ""])
    return text.encode()
