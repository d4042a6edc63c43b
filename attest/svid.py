"""SPIFFE IDs, X.509-SVIDs and SPIFFE trust bundles: the public surface of the three modules.

- :mod:`attest.spiffeid`: SPIFFE IDs and trust-domain names (parse, validate, render a template);
- :mod:`attest.x509svid`: issuing and verifying X.509-SVIDs;
- :mod:`attest.bundle`: the SPIFFE bundle document (JWK Set) and the PEM bundle.

Callers use ``from attest import svid`` and ``svid.<name>``; the names stay here when the code moves.
"""

from __future__ import annotations

from attest.bundle import (
    MAX_BUNDLE_BYTES,
    MAX_BUNDLE_KEYS,
    BundleInvalid,
    bundle_document,
    bundle_pem,
    parse_bundle_document,
)
from attest.spiffeid import (
    MAX_ID_BYTES,
    MAX_TRUST_DOMAIN_BYTES,
    SCHEME,
    SpiffeId,
    SpiffeIdError,
    parse_spiffe_id,
    render_spiffe_id,
    validate_trust_domain,
)
from attest.x509svid import CLOCK_SKEW, Signer, SvidInvalid, SvidPublicKey, issue_svid, verify_svid

__all__ = [
    "CLOCK_SKEW",
    "MAX_BUNDLE_BYTES",
    "MAX_BUNDLE_KEYS",
    "MAX_ID_BYTES",
    "MAX_TRUST_DOMAIN_BYTES",
    "SCHEME",
    "BundleInvalid",
    "Signer",
    "SpiffeId",
    "SpiffeIdError",
    "SvidInvalid",
    "SvidPublicKey",
    "bundle_document",
    "bundle_pem",
    "issue_svid",
    "parse_bundle_document",
    "parse_spiffe_id",
    "render_spiffe_id",
    "validate_trust_domain",
    "verify_svid",
]
