"""The x509pop certificate: what SPIRE's x509pop attestor needs, and facts it reads back unchanged."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given
from hypothesis import strategies as st

from attest import ca, x509pop

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


# The CAs and the node key are made when a test first asks (functools.cache), not at import: a
# refusal by the installed cryptography fails those tests, not the collection.
@functools.cache
def cas() -> ca.CaSet:
    return ca.initial("nodegate.test", now=NOW - timedelta(days=1))


@functools.cache
def node_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def issue(**kw: object) -> x509.Certificate:
    args: dict[str, object] = {
        "public_key": node_key().public_key(),
        "trust_domain": "spire.test",
        "node_name": "gpu-1",
        "facts": {x509pop.NODE: "gpu-1", x509pop.MEASURED_BOOT_CLASS: "fleet-linux"},
        "now": NOW,
        "not_after": NOW + timedelta(hours=1),
    }
    args.update(kw)
    return x509pop.issue_x509pop(cas().signer, **args)  # type: ignore[arg-type]


def test_what_spire_x509pop_needs() -> None:
    cert = issue()
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert ku.critical
    assert ku.value.digital_signature
    assert not ku.value.key_cert_sign
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.UniformResourceIdentifier
    )
    assert uris == ["x509pop://spire.test/measured-boot-class/fleet-linux", "x509pop://spire.test/node/gpu-1"]
    assert cert.subject.rfc4514_string() == "CN=gpu-1"
    cert.verify_directly_issued_by(cas().signer.certificate)
    assert cert.not_valid_after_utc == NOW + timedelta(hours=1)


def test_selectors_are_spires_reading() -> None:
    assert x509pop.selectors(issue(), "spire.test") == {"node": "gpu-1", "measured-boot-class": "fleet-linux"}
    assert x509pop.selectors(issue(), "other.test") == {}  # SPIRE reads its own trust domain only


@pytest.mark.parametrize(
    ("facts", "message"),
    [
        ({"node": "gpu-1", "pool": "a/b"}, "one segment"),  # would add a path level
        ({"node": "gpu-1", "pool": "a%2Fb"}, "one segment"),  # SPIRE decodes percent-encoding
        ({"node": "gpu-1", "pool": ".."}, "one segment"),
        ({"node": "gpu-1", "pool": ""}, "one segment"),
        ({"node": "gpu-1", "Pool": "a"}, "key"),
        ({"node": "gpu-1", "po:ol": "a"}, "key"),  # the selector is san:<key>:<value>
        ({"node": "gpu-2"}, "name the node"),
        ({"pool": "a"}, "name the node"),
    ],
)
def test_facts_spire_would_read_differently_are_refused(facts: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        issue(facts=facts)


def test_lifetime_is_bounded() -> None:
    with pytest.raises(ValueError, match="expired"):
        issue(not_after=NOW)
    with pytest.raises(ValueError, match="short-lived"):
        issue(not_after=NOW + timedelta(days=40))


@given(
    st.dictionaries(
        st.from_regex(r"[a-z0-9][a-z0-9-]{0,20}", fullmatch=True).filter(lambda k: k != "node"),
        st.from_regex(r"[A-Za-z0-9._-]{1,40}", fullmatch=True).filter(lambda v: v not in (".", "..")),
        max_size=8,
    )
)
def test_every_fact_comes_back_as_the_selector_spire_makes(facts: dict[str, str]) -> None:
    facts = {**facts, "node": "gpu-1"}
    assert x509pop.selectors(issue(facts=facts), "spire.test") == facts


def test_the_facts_could_not_ride_on_the_svid() -> None:
    """Why a second certificate: an SVID with the x509pop URI SANs beside its SPIFFE ID is refused
    by SPIFFE verifiers (exactly one URI SAN, X509-SVID §2): nodegate's and py-spiffe's."""
    from cryptography.hazmat.primitives import hashes, serialization
    from spiffe import X509Svid
    from spiffe.errors import PySpiffeError

    from attest import svid

    good = svid.issue_svid(
        cas().signer,
        spiffe_id=svid.parse_spiffe_id("spiffe://nodegate.test/node/gpu-1"),
        public_key=node_key().public_key(),
        now=NOW,
        ttl=timedelta(hours=1),
    )
    uris = [x509.UniformResourceIdentifier("spiffe://nodegate.test/node/gpu-1")]
    uris += [x509.UniformResourceIdentifier(u) for u in x509pop.fact_uris("spire.test", {"node": "gpu-1"})]
    builder = x509.CertificateBuilder(
        issuer_name=good.issuer,
        subject_name=good.subject,
        public_key=node_key().public_key(),
        serial_number=good.serial_number,
        not_valid_before=good.not_valid_before_utc,
        not_valid_after=good.not_valid_after_utc,
    )
    for ext in good.extensions:
        value = (
            x509.SubjectAlternativeName(uris)
            if isinstance(ext.value, x509.SubjectAlternativeName)
            else ext.value
        )
        builder = builder.add_extension(value, critical=ext.critical)
    both = builder.sign(cas().signer.key, hashes.SHA256())
    roots = cas().roots(NOW)
    assert svid.verify_svid(good, roots=roots, trust_domain="nodegate.test", now=NOW) is not None
    with pytest.raises(svid.SvidInvalid, match="exactly one URI SAN"):
        svid.verify_svid(both, roots=roots, trust_domain="nodegate.test", now=NOW)
    der_key = node_key().private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    X509Svid.parse_raw(good.public_bytes(serialization.Encoding.DER), der_key)
    with pytest.raises(PySpiffeError):
        X509Svid.parse_raw(both.public_bytes(serialization.Encoding.DER), der_key)


facts_st = st.dictionaries(
    st.from_regex(r"[a-z0-9][a-z0-9-]{0,8}", fullmatch=True).filter(lambda k: k != x509pop.ATTESTATION),
    st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True),
    max_size=6,
)


@given(facts_st, facts_st)
def test_the_attestation_id_names_exactly_the_facts(one: dict[str, str], other: dict[str, str]) -> None:
    """The agent's ID ends with it (docs/spire.md): the same facts in any order give the same id,
    any other fact set another (128 bits of SHA-256), and an ``attestation`` already among the
    facts is not part of it; it is one fact value SPIRE reads back unchanged."""
    got = x509pop.attestation_id(one)
    assert got == x509pop.attestation_id(dict(reversed(list(one.items()))))
    assert got == x509pop.attestation_id({**one, x509pop.ATTESTATION: "f" * 32})
    assert (got == x509pop.attestation_id(other)) == (one == other)
    assert len(got) == x509pop.ATTESTATION_HEX
    assert x509pop.is_fact_value(got)
