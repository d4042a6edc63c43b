"""Signing authorities: root shape, rotation with overlap, pruning, and the file form."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from attest import ca, svid
from attest.ca import CaSet, CaStoreError
from attest.svid import SpiffeId, SvidInvalid

NOW = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
TD = "example.org"
HOUR = timedelta(hours=1)


def node_id() -> SpiffeId:
    """The node's SPIFFE ID, built when a test runs (the constructor validates)."""
    return SpiffeId(TD, "/node/worker-1")


def _svid(signer: ca.Authority, now: datetime = NOW) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    return svid.issue_svid(signer, spiffe_id=node_id(), public_key=key.public_key(), now=now, ttl=HOUR)


def _bundle(cas: CaSet, now: datetime) -> list[x509.Certificate]:
    doc = svid.bundle_document(cas.roots(now), sequence=cas.bundle_sequence(now), refresh_hint=300)
    certs, seq = svid.parse_bundle_document(json.dumps(doc).encode())
    assert seq == cas.bundle_sequence(now)
    return certs


def test_new_authority_shape(tmp_path: Path) -> None:
    a = ca.new_authority(TD, now=NOW)
    cert = a.certificate
    assert a.created_at == NOW
    assert a.retire_at is None
    assert isinstance(a.key.curve, ec.SECP256R1)
    assert cert.public_key() == a.key.public_key()
    assert cert.subject == cert.issuer
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "nodegate"
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert isinstance(cn, str)
    assert cn.startswith("nodegate CA example.org ")
    assert len(cn.split()[-1]) == 8
    assert cert.not_valid_before_utc == NOW - timedelta(seconds=60)
    assert cert.not_valid_after_utc == NOW + timedelta(days=3650)
    exts = cert.extensions
    bc = exts.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical
    assert bc.value.ca
    assert bc.value.path_length == 0
    ku = exts.get_extension_for_class(x509.KeyUsage)
    assert ku.critical
    assert ku.value.key_cert_sign
    assert ku.value.crl_sign
    san = exts.get_extension_for_class(x509.SubjectAlternativeName)
    assert list(san.value) == [x509.UniformResourceIdentifier("spiffe://example.org")]
    ski = exts.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert exts.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier == ski.digest
    with pytest.raises(x509.ExtensionNotFound):
        exts.get_extension_for_class(x509.NameConstraints)
    cert.verify_directly_issued_by(cert)
    (tmp_path / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    text = subprocess.run(
        ["openssl", "x509", "-in", "ca.pem", "-noout", "-text"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "CA:TRUE, pathlen:0" in text
    assert "Certificate Sign, CRL Sign" in text
    assert "URI:spiffe://example.org" in text


def test_new_authorities_are_distinct_and_long_trust_domains_fit() -> None:
    a, b = ca.new_authority(TD, now=NOW), ca.new_authority(TD, now=NOW)
    assert a.certificate.subject != b.certificate.subject
    assert a.stem != b.stem
    long_td = "a" * 255
    c = ca.new_authority(long_td, now=NOW)
    cn = c.certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert isinstance(cn, str)
    assert len(cn) <= 64
    san = c.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["spiffe://" + long_td]


@pytest.mark.parametrize(
    ("td", "kw", "match"),
    [
        ("Example.org", {}, "lowercase"),
        ("spiffe://example.org", {}, "a trust domain is a name, not a SPIFFE ID"),
        (TD, {"ttl": timedelta(0)}, "ttl"),
        (TD, {"now": datetime(2026, 1, 1)}, "timezone-aware"),
    ],
)
def test_new_authority_rejects(td: str, kw: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"now": NOW, **kw}
    with pytest.raises(ValueError, match=match):  # SpiffeIdError is a ValueError too
        ca.new_authority(td, **args)


def test_initial() -> None:
    cas = ca.initial(TD, now=NOW)
    assert cas.trust_domain == TD
    assert cas.sequence == 1
    assert len(cas.authorities) == 1
    assert cas.signer is cas.authorities[0]
    assert cas.roots(NOW) == [cas.signer.certificate]
    assert cas.bundle_sequence(NOW) == 1
    assert svid.verify_svid(_svid(cas.signer), roots=cas.roots(NOW), trust_domain=TD, now=NOW) == node_id()


def test_rotation_overlap_then_prune() -> None:
    grace = 2 * HOUR
    cas = ca.initial(TD, now=NOW)
    old = cas.signer
    old_svid = _svid(old)

    t1 = NOW + timedelta(minutes=10)
    rotated = cas.rotate(now=t1, grace=grace)
    assert rotated.sequence == cas.sequence + 1
    assert rotated.signer is not old
    assert rotated.signer.created_at == t1
    assert rotated.signer.retire_at is None
    assert rotated.authorities[0].retire_at == t1 + grace
    assert rotated.authorities[0].certificate == old.certificate
    assert cas.authorities[0].retire_at is None  # the original set is untouched

    # During the grace period the bundle carries both roots; old and new SVIDs verify.
    bundle = _bundle(rotated, t1)
    assert bundle == [old.certificate, rotated.signer.certificate]
    new_svid = _svid(rotated.signer, t1)
    new_svid.verify_directly_issued_by(rotated.signer.certificate)
    for leaf in (old_svid, new_svid):
        assert (
            svid.verify_svid(leaf, roots=bundle, trust_domain=TD, now=t1 + timedelta(minutes=5)) == node_id()
        )
    assert rotated.prune(t1) is rotated

    # After retire_at the old root leaves the bundle even before pruning; the sequence moves with it.
    after = t1 + grace
    assert rotated.roots(after) == [rotated.signer.certificate]
    assert rotated.bundle_sequence(after) == rotated.sequence + 1
    pruned = rotated.prune(after)
    assert pruned.authorities == (rotated.signer,)
    assert pruned.sequence == rotated.bundle_sequence(after) == pruned.bundle_sequence(after)
    replacement_old_svid = _svid(old, after - timedelta(minutes=1))  # issued by the old key late
    for leaf in (old_svid, replacement_old_svid):
        with pytest.raises(SvidInvalid):
            svid.verify_svid(leaf, roots=pruned.roots(after), trust_domain=TD, now=after)
    assert svid.verify_svid(
        _svid(pruned.signer, after), roots=pruned.roots(after), trust_domain=TD, now=after
    )


def test_rotate_keeps_earlier_retire_times_and_rejects_negative_grace() -> None:
    cas = ca.initial(TD, now=NOW).rotate(now=NOW, grace=HOUR)
    twice = cas.rotate(now=NOW + timedelta(minutes=5), grace=3 * HOUR)
    assert [a.retire_at for a in twice.authorities] == [
        NOW + HOUR,
        NOW + timedelta(minutes=5) + 3 * HOUR,
        None,
    ]
    assert twice.sequence == 3
    with pytest.raises(ValueError, match="grace"):
        cas.rotate(now=NOW, grace=-HOUR)


def test_prune_keeps_an_expired_signer() -> None:
    cas = CaSet(TD, (ca.new_authority(TD, now=NOW, ttl=HOUR),), 1)
    later = NOW + 2 * HOUR
    assert cas.roots(later) == []
    assert cas.prune(later).authorities == cas.authorities


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["rotate", "prune", "wait"]), st.integers(0, 180)), max_size=8))
def test_bundle_sequence_never_decreases_and_tracks_root_changes(steps: list[tuple[str, int]]) -> None:
    now = NOW
    cas = ca.initial(TD, now=now)
    seen = (cas.bundle_sequence(now), [c.fingerprint(_sha()) for c in cas.roots(now)])
    for op, minutes in steps:
        if op == "rotate":
            cas = cas.rotate(now=now, grace=timedelta(minutes=minutes))
        elif op == "prune":
            cas = cas.prune(now)
        else:
            now += timedelta(minutes=minutes)
        current = (cas.bundle_sequence(now), [c.fingerprint(_sha()) for c in cas.roots(now)])
        assert current[0] >= seen[0]
        if current[1] != seen[1]:
            assert current[0] > seen[0]
        assert cas.signer.certificate in cas.roots(now)  # never expires within these few hours
        seen = current


def _sha() -> Any:
    from cryptography.hazmat.primitives import hashes

    return hashes.SHA256()


# -- dump / load -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rotated() -> CaSet:
    return ca.initial(TD, now=NOW).rotate(now=NOW + HOUR, grace=2 * HOUR)


def test_dump_shape(rotated: CaSet) -> None:
    files = rotated.dump()
    stems = [a.stem for a in rotated.authorities]
    assert set(files) == {"index.json"} | {f"{s}.key" for s in stems} | {f"{s}.pem" for s in stems}
    for s in stems:
        assert files[f"{s}.key"].startswith(b"-----BEGIN PRIVATE KEY-----\n")
        assert files[f"{s}.pem"].startswith(b"-----BEGIN CERTIFICATE-----\n")
    index = json.loads(files["index.json"])
    assert index == {
        "version": 1,
        "trust_domain": TD,
        "sequence": 2,
        "authorities": [
            {
                "stem": stems[0],
                "created_at": "2026-07-01T12:00:00+00:00",
                "retire_at": "2026-07-01T15:00:00+00:00",
            },
            {"stem": stems[1], "created_at": "2026-07-01T13:00:00+00:00", "retire_at": None},
        ],
    }


def test_dump_load_round_trip(rotated: CaSet) -> None:
    loaded = CaSet.load(rotated.dump())
    assert loaded.trust_domain == rotated.trust_domain
    assert loaded.sequence == rotated.sequence
    for a, b in zip(loaded.authorities, rotated.authorities, strict=True):
        assert a.certificate == b.certificate
        assert a.key.private_numbers() == b.key.private_numbers()
        assert (a.created_at, a.retire_at) == (b.created_at, b.retire_at)
    assert loaded.dump() == rotated.dump()
    leaf = _svid(loaded.signer, NOW + HOUR)
    assert (
        svid.verify_svid(leaf, roots=rotated.roots(NOW + HOUR), trust_domain=TD, now=NOW + HOUR) == node_id()
    )


def test_load_ignores_unreferenced_files(rotated: CaSet) -> None:
    files = rotated.dump()
    pruned = rotated.prune(NOW + 4 * HOUR)
    files.update(pruned.dump())  # the old authority's files stay behind on disk
    assert [a.stem for a in CaSet.load(files).authorities] == [pruned.signer.stem]


def _index(files: dict[str, bytes]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(files["index.json"])
    return result


def _with_index(files: dict[str, bytes], index: Any) -> dict[str, bytes]:
    return {**files, "index.json": json.dumps(index).encode()}


def test_load_rejects_key_cert_mismatch(rotated: CaSet) -> None:
    files = rotated.dump()
    s0, s1 = (a.stem for a in rotated.authorities)
    files[f"{s0}.key"], files[f"{s1}.key"] = files[f"{s1}.key"], files[f"{s0}.key"]
    with pytest.raises(CaStoreError, match="does not match"):
        CaSet.load(files)


def test_load_rejects_cert_under_wrong_stem(rotated: CaSet) -> None:
    files = rotated.dump()
    s0, s1 = (a.stem for a in rotated.authorities)
    for ext in ("key", "pem"):
        files[f"{s0}.{ext}"], files[f"{s1}.{ext}"] = files[f"{s1}.{ext}"], files[f"{s0}.{ext}"]
    with pytest.raises(CaStoreError, match="belongs to stem"):
        CaSet.load(files)


@pytest.mark.parametrize("suffix", ["key", "pem"])
@pytest.mark.parametrize("cut", [0, 1, 40, -40, -1])
def test_load_rejects_truncated_files(rotated: CaSet, suffix: str, cut: int) -> None:
    files = rotated.dump()
    name = f"{rotated.signer.stem}.{suffix}"
    files[name] = files[name][:cut]
    with pytest.raises(CaStoreError, match=name.replace(".", r"\.")):
        CaSet.load(files)


def test_load_rejects_truncated_index(rotated: CaSet) -> None:
    files = rotated.dump()
    files["index.json"] = files["index.json"][:-5]
    with pytest.raises(CaStoreError, match="not valid JSON"):
        CaSet.load(files)


def test_load_rejects_missing_and_oversized_files(rotated: CaSet) -> None:
    files = rotated.dump()
    for name in list(files):
        partial = {k: v for k, v in files.items() if k != name}
        with pytest.raises(CaStoreError, match="missing"):
            CaSet.load(partial)
    big = {**files, f"{rotated.signer.stem}.pem": files[f"{rotated.signer.stem}.pem"] + b"\n" * 20_000}
    with pytest.raises(CaStoreError, match="limit"):
        CaSet.load(big)
    with pytest.raises(CaStoreError, match="limit"):
        CaSet.load({**files, "index.json": b" " * 70_000})
    with pytest.raises(CaStoreError, match="bytes"):
        CaSet.load({**files, "index.json": files["index.json"].decode()})  # type: ignore[dict-item]


def test_load_rejects_trailing_data_and_other_encodings(rotated: CaSet) -> None:
    files = rotated.dump()
    stem = rotated.signer.stem
    other = rotated.authorities[0]
    cases = {
        f"{stem}.pem": [
            files[f"{stem}.pem"] + other.certificate.public_bytes(serialization.Encoding.PEM),
            files[f"{stem}.pem"] + b"junk",
            rotated.signer.certificate.public_bytes(serialization.Encoding.DER),
        ],
        f"{stem}.key": [
            files[f"{stem}.key"] + b"junk",
            rotated.signer.key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            ),
            rotated.signer.key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(b"pw"),
            ),
        ],
    }
    for name, variants in cases.items():
        for data in variants:
            with pytest.raises(CaStoreError, match=name.replace(".", r"\.")):
                CaSet.load({**files, name: data})


def test_load_rejects_a_foreign_certificate(rotated: CaSet) -> None:
    foreign = ca.new_authority("other.org", now=NOW)
    files = rotated.dump()
    index = _index(files)
    index["authorities"].insert(0, {"stem": foreign.stem, "created_at": NOW.isoformat(), "retire_at": None})
    files.update(CaSet("other.org", (foreign,), 1).dump())
    files = _with_index({k: v for k, v in files.items() if k != "index.json"}, index)
    with pytest.raises(CaStoreError, match=r"not a root of trust domain example\.org"):
        CaSet.load(files)


def _index_cases(rotated: CaSet) -> list[tuple[Any, str]]:
    base = _index(rotated.dump())
    s0, s1 = base["authorities"][0]["stem"], base["authorities"][1]["stem"]

    def edit(**changes: Any) -> dict[str, Any]:
        return {**base, **changes}

    def entries(*items: Any) -> dict[str, Any]:
        return edit(authorities=list(items))

    e0, e1 = base["authorities"]
    return [
        ([], "must be an object"),
        (edit(extra=1), "must be an object"),
        ({k: v for k, v in base.items() if k != "sequence"}, "must be an object"),
        (edit(version=2), "version"),
        (edit(version=True), "version"),
        (edit(trust_domain="Example.org"), "trust_domain"),
        (edit(trust_domain="other.org"), r"not a root of trust domain other\.org"),
        (edit(sequence=0), "sequence"),
        (edit(sequence="2"), "sequence"),
        (edit(sequence=True), "sequence"),
        (edit(authorities=[]), "1 to 64"),
        (edit(authorities={}), "1 to 64"),
        (entries(e0, e1, e1), "twice"),
        (entries(e1, e0), "oldest first"),
        (entries({**e0, "retire_at": None}, {**e1, "retire_at": e0["retire_at"]}), "newest authority"),
        (
            entries({**e0, "retire_at": None}, {**e1, "created_at": "2026-07-01T11:00:00+00:00"}),
            "oldest first",
        ),
        (entries(e0, {**e1, "retire_at": "2026-07-02T00:00:00+00:00"}), "newest authority"),
        (entries(e0, {**e1, "created_at": "2026-07-01T13:00:00"}), "time zone"),
        (entries(e0, {**e1, "created_at": "yesterday"}), "RFC 3339"),
        (entries(e0, {**e1, "created_at": 1}), "RFC 3339"),
        (entries(e0, {**e1, "stem": "../" + s1}), "invalid stem"),
        (entries(e0, {**e1, "stem": s1.upper()}), "invalid stem"),
        (entries(e0, {**e1, "stem": "ca-" + "0" * 16}), "missing"),
        (entries(e0, {"stem": s1, "created_at": e1["created_at"]}), "stem, created_at, retire_at"),
        (entries(e0, [s0]), "stem, created_at, retire_at"),
    ]


def test_load_rejects_wrong_index(rotated: CaSet) -> None:
    files = rotated.dump()
    for index, match in _index_cases(rotated):
        with pytest.raises(CaStoreError, match=match):
            CaSet.load(_with_index(files, index))


def test_load_rejects_duplicate_index_keys(rotated: CaSet) -> None:
    files = rotated.dump()
    text = files["index.json"].decode()
    dup = text.replace('"sequence": 2', '"sequence": 2, "sequence": 9')
    assert dup != text
    with pytest.raises(CaStoreError, match="duplicate key 'sequence'"):
        CaSet.load({**files, "index.json": dup.encode()})
    with pytest.raises(CaStoreError, match="not valid JSON"):
        CaSet.load({**files, "index.json": b"\xff"})
