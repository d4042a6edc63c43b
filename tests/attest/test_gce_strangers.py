"""Issue 33, finding 1: every Google Cloud VM has a genuine vTPM, so Google's vTPM CA alone says
"some VM of some project", never "one of ours". A real GCE EK certificate chaining to Google's
CAs is refused without a binding (``ek_untrusted``), and joins with the project it names
(docs/ek-roots.md, "Cloud vTPMs"; docs/threat-model.md)."""

from __future__ import annotations

import pytest

from attest import certparse, tpm
from attest.errors import EkUntrusted
from tests.support import realtpm
from tests.support.shared_data import shared

GOOGLE_EKS = (
    "ek/google-ek-rsa-ekak-ca.pem",
    "ek/google-ek-ecc-ekak-ca.pem",
    "ek/google-ek-rsa-cloud-host.pem",
    "ek/google-ek-ecc-cloud-host.pem",
)


def google_cas() -> tuple[list[certparse.Cert], list[certparse.Cert]]:
    """Google's published vTPM CAs from the public collection: (roots, intermediates)."""
    folder = shared("ek-roots")
    certs = [
        certparse.read_certificate(
            next(certparse.pem_blocks(folder.read(n))), trailing=certparse.FILE_WHITESPACE
        )
        for n in folder.names("google/*")
    ]
    return [c for c in certs if c.self_issued], [c for c in certs if not c.self_issued]


def ek(name: str) -> tuple[bytes, bytes, certparse.Cert]:
    raw = shared("tpm").read(name)
    der = next(certparse.pem_blocks(raw))
    cert = certparse.read_certificate(der)
    return realtpm.ek_public_for(cert.key), der, cert


@pytest.mark.parametrize("name", GOOGLE_EKS)
def test_a_strangers_gce_ek_is_refused_without_a_binding(name: str) -> None:
    """The attack: the operator trusts Google's vTPM CA (as the old `vendors` store did) and any
    GCE VM of any project presents its genuine EK certificate."""
    roots, intermediates = google_cas()
    ek_public, der, cert = ek(name)
    with pytest.raises(EkUntrusted) as caught:
        tpm.verify_ek(ek_public, der, roots=roots, intermediates=intermediates, now=realtpm.valid_at(cert))
    assert caught.value.code == "ek_untrusted"
    assert "ek_cloud.gce.projects" in caught.value.detail
