"""Cloud vTPM chains need their own binding (attest/cloudek.py) and GCE's instance identity is
read strictly (attest/gceidentity.py); the attack itself is tests/attest/test_gce_strangers.py."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attest import cloudek, gceidentity, tpm
from attest.errors import EkUntrusted
from tests.attest.test_gce_strangers import GOOGLE_EKS, ek, google_cas
from tests.support import realtpm
from tests.support.ekvendors import collection_certs

PROJECT = "google.com:wuale-gcp-testing"
PROJECT_NUMBER = "117478743145"
# The EK/AK CA certificates' instance identity, as Google's CA wrote it.
REAL = bytes.fromhex(
    "306e0c0d75732d63656e7472616c312d6102051b5a475c690c1c676f6f676c652e636f6d3a7775616c652d6763702d"
    "74657374696e670208030878c5bdd3d99d0c0c63732d64656275672d706361a020301ea003020100a1030101ffa203"
    "0101ffa303010100a403010100a503010100"
)


def verify(name: str, bindings: cloudek.CloudBindings) -> tpm.EkIdentity:
    roots, intermediates = google_cas()
    ek_public, der, cert = ek(name)
    return tpm.verify_ek(
        ek_public, der, roots=roots, intermediates=intermediates, now=realtpm.valid_at(cert), cloud=bindings
    )


@pytest.mark.parametrize("name", GOOGLE_EKS)
@pytest.mark.parametrize(
    "bindings",
    [
        cloudek.CloudBindings(gce_projects=frozenset({PROJECT})),
        cloudek.CloudBindings(gce_projects=frozenset({PROJECT_NUMBER})),
        cloudek.CloudBindings(gce_projects=frozenset({"other", PROJECT})),
    ],
    ids=["project-id", "project-number", "one-of-two"],
)
def test_a_genuine_gce_vm_of_a_bound_project_passes(name: str, bindings: cloudek.CloudBindings) -> None:
    ident = verify(name, bindings)
    assert ident.binding.startswith(f"gce project {PROJECT} instance ")
    assert ident.trusted_by.startswith("chain:CN=")


def test_a_bound_instance_passes_and_another_does_not() -> None:
    ident = verify(GOOGLE_EKS[0], cloudek.CloudBindings(gce_instances=frozenset({"218557372616137117"})))
    assert ident.binding == f"gce project {PROJECT} instance 218557372616137117"
    with pytest.raises(EkUntrusted, match=r"not in ek_cloud\.gce"):
        verify(GOOGLE_EKS[0], cloudek.CloudBindings(gce_instances=frozenset({"218557372616137118"})))


@pytest.mark.parametrize("name", GOOGLE_EKS)
def test_another_projects_vm_is_refused(name: str) -> None:
    with pytest.raises(EkUntrusted, match=r"is not in ek_cloud\.gce") as caught:
        verify(name, cloudek.CloudBindings(gce_projects=frozenset({"my-project", "123"})))
    assert caught.value.code == "ek_untrusted"


def test_the_leafs_identity_makes_it_a_cloud_chain_whatever_the_root() -> None:
    """Google may rotate its roots: the EK certificate itself says it is a GCE vTPM's."""
    _, _, cert = ek(GOOGLE_EKS[0])
    assert cloudek.cloud_provider([cert]) == cloudek.GCE
    with pytest.raises(EkUntrusted, match=r"configure ek_cloud\.gce\.projects"):
        cloudek.check_binding([cert], cloudek.NO_BINDINGS)


def test_a_ca_marked_cloud_at_import_needs_a_binding() -> None:
    (some_ca,) = collection_certs("nuvoton/Nuvoton-TPM-Root-CA-2111-*")
    assert cloudek.cloud_provider([some_ca]) is None
    marked = cloudek.CloudBindings(marked={some_ca.sha256: cloudek.ALIBABA})
    assert cloudek.cloud_provider([some_ca], marked) == cloudek.ALIBABA
    with pytest.raises(EkUntrusted, match="allowlist these EKs"):
        cloudek.check_binding([some_ca], marked)


# -- the instance identity ------------------------------------------------------------------------


def test_the_real_instance_identity_reads() -> None:
    info = gceidentity.parse(REAL)
    assert (info.zone, info.project_id, info.instance_name) == ("us-central1-a", PROJECT, "cs-debug-pca")
    assert (info.project_number, info.instance_id) == (117478743145, 218557372616137117)
    assert (info.security_version, info.is_production) == (0, True)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (REAL + b"\x00", "not exactly one SEQUENCE"),
        (b"\x30\x81\x05" + REAL[2:7], "shortest form"),
        (REAL[:-1], "runs past the end"),
        (b"\x30\x00", "fields are not"),
        (bytes.fromhex("300f0c01610201ff0c0162020101") + b"\x0c\x01c", "negative"),
        (bytes.fromhex("3010") + bytes.fromhex("0c01610202007f0c0162020101") + b"\x0c\x01c", "minimally"),
        (b"", "0 bytes"),
    ],
    ids=["trailing", "long-length", "truncated", "empty-sequence", "negative", "non-minimal", "nothing"],
)
def test_a_malformed_identity_is_refused(raw: bytes, why: str) -> None:
    with pytest.raises(EkUntrusted, match=why) as caught:
        gceidentity.parse(raw)
    assert caught.value.code == "ek_untrusted"


def test_a_non_der_boolean_is_refused() -> None:
    bad = REAL.replace(bytes.fromhex("a1030101ff"), bytes.fromhex("a103010101"))
    with pytest.raises(EkUntrusted, match="DER BOOLEAN"):
        gceidentity.parse(bad)


def test_absent_security_properties_mean_not_production() -> None:
    without = bytes([0x30, 0x6E - 0x22]) + REAL[2:-0x22]  # the 34-byte [0] securityProperties dropped
    info = gceidentity.parse(without)
    assert (info.project_id, info.is_production, info.security_version) == (PROJECT, False, None)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_edit_of_the_identity_reads_or_is_refused_with_its_code(data: st.DataObject) -> None:
    raw = bytearray(REAL)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    try:
        info = gceidentity.parse(bytes(raw))
    except EkUntrusted as exc:
        code = exc.code
        assert code == "ek_untrusted"
    else:
        assert info.project_number >= 0
        assert info.instance_id >= 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise_anything_else(raw: bytes) -> None:
    with contextlib.suppress(EkUntrusted):
        gceidentity.parse(raw)
