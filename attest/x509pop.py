"""The certificate SPIRE's ``x509pop`` node attestor accepts, carrying what nodegate attested.

SPIRE's x509pop server plugin (``mode = "external_pki"``) verifies a node's certificate against a
CA bundle, has the agent prove possession of its key, and turns every URI SAN of the form
``x509pop://<trust domain>/<key>/<value>`` into the selector ``x509pop:san:<key>:<value>``
(docs/spire.md). So nodegate issues, next to the node's X.509-SVID and for the same key, a second
certificate whose URI SANs are the attested facts. It cannot be the SVID itself: an X.509-SVID
carries exactly one URI SAN (X509-SVID §2) and SPIFFE verifiers must reject more.

Everything here is pure: callers pass ``now``, the validity end and the signing authority.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from attest.spiffeid import validate_trust_domain
from attest.x509svid import CLOCK_SKEW, Signer, SvidPublicKey, _check_subject_key, sign_leaf

SCHEME = "x509pop://"
MAX_FACTS = 16
# A key and a value are each one URI path segment that needs no percent-encoding (SPIRE reads the
# decoded path, so an encoded value would come out differently from what nodegate meant), and a key
# has no ':' (the selector is "san:<key>:<value>").
_KEY = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_VALUE = re.compile(r"[A-Za-z0-9._-]{1,128}")

# The facts nodegate puts in (docs/spire.md, "Selectors"): each is x509pop:san:<key>:<value>.
NODE = "node"  # the node name: the first level of the agent's ID (agent_path_template)
EK_SHA256 = "ek-sha256"
POOL = "pool"
PCR_CLASS = "pcr-class"
MEASURED_BOOT_CLASS = "measured-boot-class"
BOOT_ID = "boot-id"
# A digest of all the other facts: the second level of the agent's ID, so the certificates of one
# attestation share an agent ID and those of any other (an earlier boot, a refused one's
# predecessor) have another, which nodegate bans without touching the current one.
ATTESTATION = "attestation"
_ATTESTATION_DOMAIN = b"nodegate x509pop attestation v1\n"
ATTESTATION_HEX = 32  # 128 bits of SHA-256


def is_fact_value(value: object) -> bool:
    return isinstance(value, str) and _VALUE.fullmatch(value) is not None and value not in (".", "..")


def attestation_id(facts: Mapping[str, str]) -> str:
    """The ``attestation`` fact for ``facts`` (every fact but itself): SHA-256 over the sorted
    ``key=value`` lines, first 128 bits in hex. The same facts give the same id, so renewals within
    a boot keep the agent's ID; any change of boot, class, pool or TPM gives another."""
    lines = b"".join(f"{key}={facts[key]}\n".encode() for key in sorted(facts) if key != ATTESTATION)
    return hashlib.sha256(_ATTESTATION_DOMAIN + lines).hexdigest()[:ATTESTATION_HEX]


def fact_uris(trust_domain: str, facts: Mapping[str, str]) -> list[str]:
    """``x509pop://<td>/<key>/<value>`` for each fact, in key order. Raises ValueError for a key or
    value that SPIRE would not read back unchanged."""
    validate_trust_domain(trust_domain)
    if len(facts) > MAX_FACTS:
        raise ValueError(f"more than {MAX_FACTS} x509pop facts")
    out = []
    for key in sorted(facts):
        value = facts[key]
        if not isinstance(key, str) or _KEY.fullmatch(key) is None:
            raise ValueError(f"x509pop fact key {key!r} must be lowercase a-z, 0-9 and '-'")
        if not is_fact_value(value):
            raise ValueError(f"x509pop fact {key} value {value!r} must be one segment of A-Za-z0-9 . - _")
        out.append(f"{SCHEME}{trust_domain}/{key}/{value}")
    return out


def issue_x509pop(
    signer: Signer,
    *,
    public_key: SvidPublicKey,
    trust_domain: str,
    node_name: str,
    facts: Mapping[str, str],
    now: datetime,
    not_after: datetime,
) -> x509.Certificate:
    """Sign the x509pop certificate for ``public_key`` (the key the node's SVID certifies).

    ``trust_domain`` is SPIRE's (the x509pop plugin reads only SANs of its own trust domain).
    Subject CN is the node name (selector ``x509pop:subject:cn:<node>``); KeyUsage
    digitalSignature (SPIRE's challenge needs it), clientAuth, not a CA.
    """
    if now.tzinfo is None or not_after.tzinfo is None:
        raise ValueError("now and not_after must be timezone-aware")
    key = _check_subject_key(public_key)
    if facts.get(NODE) != node_name:
        raise ValueError("the facts must name the node (key 'node')")
    uris = fact_uris(trust_domain, facts)
    ca_cert = signer.certificate
    end = min(not_after, ca_cert.not_valid_after_utc)
    if end <= now:
        raise ValueError("the x509pop certificate would be expired (or its signer is)")
    if end - now > timedelta(days=31):
        raise ValueError("x509pop certificates are short-lived (at most 31 days)")
    return sign_leaf(
        signer,
        key,
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_name)]),
        [x509.UniformResourceIdentifier(u) for u in uris],
        san_critical=False,
        not_before=now - CLOCK_SKEW,
        not_after=end,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )


def selectors(cert: x509.Certificate, trust_domain: str) -> dict[str, str]:
    """The ``san`` selectors SPIRE derives from ``cert`` (its parseUriSanSelectors): key -> value
    for each ``x509pop://<trust_domain>/<key>/<value>`` URI SAN, a later duplicate key winning."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return {}
    prefix = f"{SCHEME}{trust_domain}/"
    out: dict[str, str] = {}
    for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.startswith(prefix):
            parts = uri[len(prefix) :].strip("/").split("/", 1)
            if len(parts) == 2:
                out[parts[0]] = parts[1]
    return out
