"""The swtpm harness itself: EK certificates chain to the session CA, cleanup works."""

from __future__ import annotations

from bootstrap.node.tpm import Agent, transient_handles
from tests.support.swtpms import TpmInfo


def test_ek_certificates_are_issued_by_the_session_ca(swtpm: TpmInfo) -> None:
    with Agent(swtpm.tcti) as tpm:
        rsa_template, rsa_cert = tpm.read_ek_certificate("rsa")
        ecc_template, ecc_cert = tpm.read_ek_certificate("ecc")
    assert rsa_template == "EK-RSA2048"
    assert ecc_template == "EK-HIGH-ECC384"
    assert rsa_cert is not None
    assert ecc_cert is not None
    from cryptography import x509

    for der in (rsa_cert, ecc_cert):
        cert = x509.load_der_x509_certificate(der)
        cert.verify_directly_issued_by(swtpm.intermediate)
    swtpm.intermediate.verify_directly_issued_by(swtpm.root)


def test_transient_objects_are_flushed_between_tests(swtpm: TpmInfo) -> None:
    agent = Agent(swtpm.tcti).__enter__()
    agent.create_ak()
    agent._handles.clear()  # simulate a crashed client that leaves its AK loaded
    agent.ctx.close()
    agent._ctx = None
    assert swtpm.server.flush_transients() == 1
    from tpm2_pytss import ESAPI

    ctx = ESAPI(swtpm.tcti)
    try:
        assert transient_handles(ctx) == []
    finally:
        ctx.close()
