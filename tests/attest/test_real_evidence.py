"""Real evidence from real machines (the public test data's tpm/, provenance in its manifest.json), judged
through the public API: EK certificates against the vendor root store nodegate ships, real quotes
against their AK and PCRs, real event logs replayed against the quoted PCRs."""

from __future__ import annotations

import hashlib
import json

import pytest

from attest import certparse, cloudek, ekcert, eventlog, tpm, wire
from attest.errors import (
    AkInvalid,
    EkMismatch,
    EkUntrusted,
    EventLogMismatch,
    MalformedInput,
    NonceMismatch,
    PcrDigestMismatch,
    QuoteSignatureInvalid,
)
from attest.keys import public_key, spki_der
from bootstrap.service.join import ekroots
from tests.support import realtpm
from tests.support.shared_data import shared

NONCE_9009 = b"\x90\x09"  # go-tpm-tools' server/verify_test.go asks for this nonce


# The GCE project the real Google EK certificates name (their instance identity extension): the
# binding a genuine GCE VM of that project joins with (docs/ek-roots.md, "Cloud vTPMs").
GCE_PROJECT = cloudek.CloudBindings(gce_projects=frozenset({"google.com:wuale-gcp-testing"}))


@pytest.fixture(scope="module")
def store() -> ekroots.Roots:
    """The public collection of 198 vendor and cloud CAs (shared data, a store with its manifest),
    as an ``ek_roots`` folder entry loads it."""
    folder = shared("ek-roots")
    folder.verify_all()
    roots = ekroots.load_roots([folder.path])
    assert roots.skipped == ()
    return roots


def test_every_file_is_listed_with_provenance() -> None:
    listed = realtpm.manifest()
    folder = realtpm.TPM.path
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert on_disk - {"manifest.json"} == set(listed)
    for name, entry in listed.items():
        assert hashlib.sha256(realtpm.data(name)).hexdigest() == entry["sha256"]
        assert set(entry["source"]) >= {"repo", "commit", "path"}
        assert len(entry["source"]["commit"]) == 40
        assert entry["licence"]
        assert entry["fetched"]


# Root each genuine EK certificate chains to in the shipped store, the tolerated quirks it needs, and
# the length of the path built (EK certificate, intermediates, root): Nuvoton signs EK certificates
# straight from a root, the others through one or two intermediates.
EXPECTED = {
    "ek/google-ek-rsa-ekak-ca.pem": ("CN=EK/AK CA Root", (), 3),
    "ek/google-ek-ecc-ekak-ca.pem": ("CN=EK/AK CA Root", (), 3),
    "ek/google-ek-rsa-cloud-host.pem": ("CN=tpm_ek_v1_cloud_host_root-signer", (), 3),
    "ek/google-ek-ecc-cloud-host.pem": ("CN=tpm_ek_v1_cloud_host_root-signer", (), 3),
    "ek/stmicro-ek-rsa.der": ("CN=GlobalSign Trusted Platform Module Root CA", ("nv-padding",), 4),
    "ek/stmicro-ek-ecc.der": ("CN=GlobalSign Trusted Platform Module ECC Root CA", (), 4),
    "ek/infineon-ek-rsa-mfr-ca022.der": ("CN=Infineon OPTIGA(TM) RSA Root CA,", (), 3),
    "ek/infineon-ek-ecc-mfr-ca022.der": ("CN=Infineon OPTIGA(TM) ECC Root CA,", (), 3),
    "ek/infineon-ek-rsa-mfr-ca007.der": ("CN=Infineon OPTIGA(TM) RSA Root CA,", (), 3),
    "ek/nuvoton-ek-rsa-root1110.der": ("C=TW+CN=Nuvoton TPM Root CA 1110+", ("unsorted-set",), 2),
    "ek/nuvoton-ek-rsa-root2110.der": ("C=TW+CN=Nuvoton TPM Root CA 2110+", ("unsorted-set",), 2),
    "ek/nuvoton-ek-rsa-root2111.der": ("C=TW+CN=Nuvoton TPM Root CA 2111+", ("unsorted-set",), 2),
}


def test_the_expectations_cover_every_ek_fixture() -> None:
    assert set(EXPECTED) == set(realtpm.named("ek-certificate"))


def test_every_discrete_tpm_vendor_has_a_real_ek_fixture() -> None:
    vendors = {realtpm.manifest()[name]["vendor"] for name in EXPECTED}
    assert vendors == {"google", "stmicro", "infineon", "nuvoton"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_ek_certificates_verify_against_the_shipped_store(name: str, store: ekroots.Roots) -> None:
    der = realtpm.certificate_bytes(name)
    cert = certparse.read_certificate(der)
    ident = tpm.verify_ek(
        realtpm.ek_public_for(cert.key),
        der,
        roots=store.anchors,
        intermediates=store.intermediates,
        now=realtpm.valid_at(cert),
        cloud=GCE_PROJECT,  # binds the Google ones; the TPM makers' chains need none
    )
    root, quirks, path = EXPECTED[name]
    assert ident.trusted_by.startswith("chain:" + root)
    assert ident.quirks == quirks
    assert len(ident.links) == path  # a real path was built, through the vendor's own CAs
    vendor = realtpm.manifest()[name]["vendor"]
    assert all(store.listed[link.sha256].vendor == vendor for link in ident.links[1:])
    assert store.listed[ident.links[-1].sha256].role == "root"


# Nuvoton's two root series (docs/ek-roots.md): the "old" roots 0100, 1013, 1014, 1110, 1111 and
# 2010-2012 (NTC EK Root CA 01/02 for TPM 1.2) and the "new" 2110-2112. The roots in use sign EK
# certificates directly (ECDSA P-256); a fleet mixes both series, so the store must hold both and
# each root must vouch only for its own certificates.
NUVOTON_GENERATIONS = {
    "old": {"0100", "1013", "1014", "1110", "1111", "2010", "2011", "2012"},
    "new": {"2110", "2111", "2112"},
}
NUVOTON = {
    "ek/nuvoton-ek-rsa-root1110.der": ("1110", "old"),  # NPCT6xx, 2018
    "ek/nuvoton-ek-rsa-root2110.der": ("2110", "new"),  # NPCT6xx, 2017
    "ek/nuvoton-ek-rsa-root2111.der": ("2111", "new"),  # NPCT75x, 2019
}


def test_the_nuvoton_fixtures_cover_both_root_generations() -> None:
    assert set(NUVOTON) == set(realtpm.named("ek-certificate", "nuvoton"))
    assert {generation for _, generation in NUVOTON.values()} == set(NUVOTON_GENERATIONS)
    assert all(number in NUVOTON_GENERATIONS[generation] for number, generation in NUVOTON.values())


@pytest.mark.parametrize("name", sorted(NUVOTON))
def test_each_nuvoton_ek_verifies_under_its_own_root_and_no_other(name: str, store: ekroots.Roots) -> None:
    number, _ = NUVOTON[name]
    der = realtpm.certificate_bytes(name)
    cert = certparse.read_certificate(der)
    ek_public = realtpm.ek_public_for(cert.key)
    at = realtpm.valid_at(cert)
    ident = tpm.verify_ek(ek_public, der, roots=store.anchors, intermediates=store.intermediates, now=at)
    anchor = store.listed[ident.links[-1].sha256]
    assert (anchor.vendor, anchor.role) == ("nuvoton", "root")
    assert f"CN=Nuvoton TPM Root CA {number}+" in anchor.subject
    others = tuple(c for c in store.anchors if c.sha256 != ident.links[-1].sha256)
    assert any("Nuvoton TPM Root CA" in store.listed[c.sha256].subject for c in others)
    with pytest.raises(EkUntrusted) as caught:
        tpm.verify_ek(ek_public, der, roots=others, intermediates=store.intermediates, now=at)
    assert caught.value.code == "ek_untrusted"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_real_ek_certificate_does_not_vouch_for_another_key(name: str, store: ekroots.Roots) -> None:
    der = realtpm.certificate_bytes(name)
    other = certparse.read_certificate(realtpm.certificate_bytes("ek/google-ek-ecc-ekak-ca.pem"))
    if name == "ek/google-ek-ecc-ekak-ca.pem":
        other = certparse.read_certificate(realtpm.certificate_bytes("ek/stmicro-ek-ecc.der"))
    with pytest.raises(EkMismatch) as caught:
        tpm.verify_ek(
            realtpm.ek_public_for(other.key), der, roots=store.anchors, intermediates=store.intermediates
        )
    assert caught.value.code == "ek_mismatch"


def test_without_the_vendor_store_real_ek_certificates_are_untrusted() -> None:
    der = realtpm.certificate_bytes("ek/stmicro-ek-rsa.der")
    cert = certparse.read_certificate(der)
    with pytest.raises(EkUntrusted) as caught:
        tpm.verify_ek(realtpm.ek_public_for(cert.key), der, roots=(), now=realtpm.valid_at(cert))
    assert caught.value.code == "ek_untrusted"


def test_a_real_ek_certificate_is_judged_at_the_given_time(store: ekroots.Roots) -> None:
    der = realtpm.certificate_bytes("ek/stmicro-ek-rsa.der")
    cert = certparse.read_certificate(der)
    too_late = cert.view.not_valid_after_utc.replace(year=cert.view.not_valid_after_utc.year + 1)
    with pytest.raises(EkUntrusted, match="expired on 2028-07-11"):
        tpm.verify_ek(
            realtpm.ek_public_for(cert.key),
            der,
            roots=store.anchors,
            intermediates=store.intermediates,
            now=too_late,
        )


@pytest.mark.parametrize("name", realtpm.named("ak-certificate"))
def test_real_ak_certificates_are_refused_as_ek_certificates(name: str, store: ekroots.Roots) -> None:
    """Same CA, same store: only the certificate's key usage tells an AK certificate apart."""
    der = realtpm.certificate_bytes(name)
    cert = certparse.read_certificate(der)
    with pytest.raises(EkUntrusted, match="key usage") as caught:
        tpm.verify_ek(
            realtpm.ek_public_for(cert.key),
            der,
            roots=store.anchors,
            intermediates=store.intermediates,
            now=realtpm.valid_at(cert),
        )
    assert caught.value.code == "ek_untrusted"
    issuer = next(c for c in store.intermediates if c.view.subject == cert.view.issuer)
    assert ekcert.signed_by(cert, issuer) is None  # genuinely issued by the shipped Google CA


# -- a GCE Shielded VM's attestation (go-tpm-tools) ------------------------------------------------


@pytest.fixture(scope="module")
def gce() -> realtpm.Attestation:
    return realtpm.gce_attestation(realtpm.data("attestations/gce-cos-85-nonce9009.pb"))


def test_the_gce_attestation_carries_three_banks(gce: realtpm.Attestation) -> None:
    assert [q.bank for q in gce.quotes] == ["sha1", "sha256", "sha384"]
    assert all(sorted(q.pcrs) == list(range(24)) for q in gce.quotes)


@pytest.mark.parametrize("bank", ["sha1", "sha256", "sha384"])
def test_a_real_gce_quote_verifies_against_its_ak_and_pcrs(gce: realtpm.Attestation, bank: str) -> None:
    ak = tpm.verify_ak(gce.ak_public)
    assert (ak.scheme, ak.hash_alg) == (wire.Alg.RSASSA, wire.Alg.SHA256)
    q = next(q for q in gce.quotes if q.bank == bank)
    result = tpm.verify_quote(
        gce.ak_public,
        q.quote,
        q.signature,
        selection=q.selection,
        pcrs={bank: q.pcrs},
        qualifying_data=NONCE_9009,
    )
    assert result.pcrs[bank] == q.pcrs
    assert result.counters.reset_count == 10


def test_a_real_gce_quote_with_one_pcr_changed_is_refused(gce: realtpm.Attestation) -> None:
    q = gce.quotes[1]
    forged = dict(q.pcrs)
    forged[7] = bytes(32)  # e.g. hide that Secure Boot state changed
    with pytest.raises(PcrDigestMismatch) as caught:
        tpm.verify_quote(
            gce.ak_public, q.quote, q.signature, selection=q.selection, pcrs={"sha256": forged},
            qualifying_data=NONCE_9009,
        )  # fmt: skip
    assert caught.value.code == "pcr_digest_mismatch"


def test_a_real_gce_quote_with_one_byte_changed_is_refused(gce: realtpm.Attestation) -> None:
    q = gce.quotes[1]
    tampered = q.quote[:-1] + bytes([q.quote[-1] ^ 1])
    with pytest.raises(QuoteSignatureInvalid):
        tpm.verify_quote(
            gce.ak_public, tampered, q.signature, selection=q.selection, pcrs={"sha256": q.pcrs},
            qualifying_data=NONCE_9009,
        )  # fmt: skip


def test_a_real_quote_without_a_nonce_is_not_fresh() -> None:
    """The same machine's quotes made without a nonce: the signature verifies (it is checked
    first), then the missing nonce refuses them; an empty expected nonce is never accepted."""
    att = realtpm.gce_attestation(realtpm.data("attestations/gce-cos-85-no-nonce.pb"))
    q = att.quotes[1]
    common = {"selection": q.selection, "pcrs": {q.bank: q.pcrs}}
    with pytest.raises(NonceMismatch) as caught:
        tpm.verify_quote(att.ak_public, q.quote, q.signature, qualifying_data=NONCE_9009, **common)  # type: ignore[arg-type]
    assert caught.value.code == "nonce_mismatch"
    with pytest.raises(MalformedInput, match="disables freshness"):
        tpm.verify_quote(att.ak_public, q.quote, q.signature, qualifying_data=b"", **common)  # type: ignore[arg-type]


def test_the_gce_ak_certificate_certifies_the_quoting_ak(
    gce: realtpm.Attestation, store: ekroots.Roots
) -> None:
    assert gce.ak_certificate is not None
    cert = certparse.read_certificate(gce.ak_certificate)
    ak_key = public_key(wire.parse_public(gce.ak_public))
    assert spki_der(ak_key) == spki_der(cert.key)  # type: ignore[arg-type]
    issuer = next(c for c in store.intermediates if c.view.subject == cert.view.issuer)
    assert ekcert.signed_by(cert, issuer) is None
    assert store.listed[issuer.sha256].vendor == "google"


@pytest.mark.parametrize("bank", ["sha1", "sha256", "sha384"])
def test_the_real_gce_event_log_replays_to_the_quoted_pcrs(gce: realtpm.Attestation, bank: str) -> None:
    log = eventlog.parse(gce.event_log)
    assert log.banks == ("sha1", "sha256", "sha384")
    quoted = next(q for q in gce.quotes if q.bank == bank).pcrs
    firmware = {i: v for i, v in quoted.items() if i != 10}
    replayed = eventlog.verify_replay(log, {bank: firmware})
    assert set(replayed[bank]) >= set(range(10))  # firmware, boot loader and kernel: all shown
    # PCR 10 is the kernel's IMA log, not the firmware's: the firmware log cannot show it.
    with pytest.raises(EventLogMismatch, match=f"{bank}:10 .*no event extends it"):
        eventlog.verify_replay(log, {bank: quoted})


def test_a_real_event_log_with_one_digest_changed_no_longer_replays(gce: realtpm.Attestation) -> None:
    log = eventlog.parse(gce.event_log)
    event = next(e for e in log.events if e.pcr == 4 and "sha256" in e.digests)
    digest = event.digests["sha256"]
    at = gce.event_log.index(digest)
    forged = gce.event_log[:at] + bytes(len(digest)) + gce.event_log[at + len(digest) :]
    quoted = {i: v for i, v in gce.quotes[1].pcrs.items() if i != 10}
    with pytest.raises(EventLogMismatch, match="sha256:4"):
        eventlog.verify_replay(eventlog.parse(forged), {"sha256": quoted})


# -- a Windows GCE Shielded VM (go-attestation) ----------------------------------------------------


def test_a_real_windows_ak_with_a_sha1_scheme_is_refused() -> None:
    win = realtpm.windows_attestation(realtpm.data("attestations/windows-gcp-shielded-vm.json"))
    with pytest.raises(AkInvalid, match="SHA-256") as caught:
        tpm.verify_ak(win.ak_public)
    assert caught.value.code == "ak_invalid"
    with pytest.raises(AkInvalid):
        tpm.verify_quote(
            win.ak_public, win.quote, win.signature, selection="sha1:0", pcrs={"sha1": {0: win.pcrs[0]}},
            qualifying_data=b"n",
        )  # fmt: skip


def test_the_real_windows_event_log_replays_to_its_sha1_pcrs() -> None:
    win = realtpm.windows_attestation(realtpm.data("attestations/windows-gcp-shielded-vm.json"))
    log = eventlog.parse(win.event_log)
    assert log.banks == ("sha1",)
    replayed = eventlog.verify_replay(log, {"sha1": win.pcrs})
    assert replayed["sha1"][0] == win.pcrs[0]


def test_the_fixture_manifest_is_valid_json_with_known_kinds() -> None:
    realtpm.TPM.require()
    doc = json.loads((realtpm.TPM.path / "manifest.json").read_text())
    assert doc["format"] == "nodegate-fixtures/1"
    kinds = {
        "ek-certificate",
        "ak-certificate",
        "attestation",
        "ek-public",
        "not-an-event-log",
        "ek-service-answer",
    }
    assert {e["kind"] for e in doc["entries"]} == kinds
