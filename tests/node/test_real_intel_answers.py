"""Real answers of Intel's EK certificate service (ekop.intel.com) for real Intel PTT EKs
(tests/fixtures/tpm/ftpm/, provenance in its manifest.json).

Known gap, pinned here so that it cannot go unnoticed: every Intel PTT EK certificate published so
far encodes DEFAULT values, which DER forbids (X.690 11.5): ``critical BOOLEAN FALSE`` in the
subjectDirectoryAttributes extension and ``cA BOOLEAN FALSE`` in basicConstraints (the bytes
``30 24 06 03 55 1d 09 01 01 00`` and ``30 03 01 01 00``). ``cryptography`` refuses them
("EncodedDefault") and ``attest.certparse`` admits only the quirks it lists, so such a certificate
is refused as malformed by the server and by ``nodegate join``'s fetch. When certparse learns to
tolerate this quirk, these tests must turn into verifications: the SPTH certificate chains to the
Intel EK root in the shipped store; the GLK intermediate is not in the store yet.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from urllib.parse import unquote

import pytest

from attest import certparse
from attest.errors import MalformedInput
from bootstrap.node import ekfetch
from bootstrap.node.errors import JoinFailed
from tests.support import realtpm

RSA_ANSWER = "ftpm/intel-ptt-ek-rsa-answer.json"
ANSWERS = realtpm.named("ek-service-answer", "intel")


def _certificate(name: str) -> bytes:
    value = unquote(json.loads(realtpm.data(name))["certificate"])
    return base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_", validate=True)


def test_both_real_intel_answers_are_committed() -> None:
    assert ANSWERS == ["ftpm/intel-ptt-ek-ecc-glk-answer.json", RSA_ANSWER]


def test_the_real_rsa_answer_is_the_one_for_the_real_ptt_ek() -> None:
    """The answer and the EK public come from two projects; Intel's pubhash ties them together."""
    url = ekfetch.certificate_url(ekfetch.INTEL, realtpm.data("ftpm/intel-ptt-ek-rsa.pub"))
    assert url is not None
    assert url.rsplit("/", 1)[1] == json.loads(realtpm.data(RSA_ANSWER))["pubhash"]


@pytest.mark.parametrize("name", ANSWERS)
def test_a_real_intel_ek_certificate_encodes_defaults_and_is_refused(name: str) -> None:
    der = _certificate(name)
    assert b"\x30\x03\x01\x01\x00" in der  # basicConstraints { cA FALSE }, DEFAULT encoded
    assert bytes.fromhex("0603551d09010100") in der  # subjectDirectoryAttributes, critical FALSE
    with pytest.raises(MalformedInput, match="EncodedDefault") as caught:
        certparse.read_certificate(der, "EK certificate")
    assert caught.value.code == "malformed_request"


def test_join_refuses_the_real_intel_answer_for_its_own_ek(tmp_path: Path) -> None:
    """What ``nodegate join --ek-cert-file`` (and the fetch, which shares the check) does today with
    the service's genuine answer for this very EK."""
    answer = tmp_path / "ek-cert.json"
    answer.write_bytes(realtpm.data(RSA_ANSWER))
    with pytest.raises(JoinFailed, match="EncodedDefault") as caught:
        ekfetch.read_certificate_file(answer, realtpm.data("ftpm/intel-ptt-ek-rsa.pub"))
    assert caught.value.code == "ek_certificate_invalid"
