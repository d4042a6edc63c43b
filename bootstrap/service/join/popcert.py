"""The certificate for SPIRE's x509pop attestor issued with an SVID (docs/spire.md): its facts,
with their ``attestation`` digest, and the certificate itself."""

from __future__ import annotations

from datetime import datetime

from cryptography import x509 as cx509
from cryptography.hazmat.primitives import serialization

from attest import x509pop
from bootstrap.service.join.evidence import Evidence


def x509pop_facts(node_name: str, ek_sha256: str, pool: str | None, judged: Evidence) -> dict[str, str]:
    """The attested facts as the certificate's URI SANs, and their ``attestation`` digest (the
    agent's ID: one per attestation, issue 44)."""
    facts = {x509pop.NODE: node_name, x509pop.EK_SHA256: ek_sha256}
    if pool is not None:
        facts[x509pop.POOL] = pool
    for key, value in (
        (x509pop.PCR_CLASS, judged.pcr_class),
        (x509pop.MEASURED_BOOT_CLASS, judged.measured_boot_class),
        (x509pop.BOOT_ID, judged.boot_id),
    ):
        if value is not None:
            facts[key] = value
    facts[x509pop.ATTESTATION] = x509pop.attestation_id(facts)
    return facts


def x509pop_pem(
    signer: object,
    trust_domain: str,
    node_name: str,
    facts: dict[str, str],
    public_key: object,
    now: datetime,
    not_after: datetime,
) -> str:
    """The same key and lifetime as the SVID, so it is renewed exactly while the node is (never
    for a revoked node), and the attested facts as URI SANs."""
    cert: cx509.Certificate = x509pop.issue_x509pop(
        signer,  # type: ignore[arg-type]
        public_key=public_key,  # type: ignore[arg-type]  # parse_node_csr admitted only EC/RSA
        trust_domain=trust_domain,
        node_name=node_name,
        facts=facts,
        now=now,
        not_after=not_after,
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()
