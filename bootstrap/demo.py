"""`nodegate demo`: the attestation core end to end on software TPMs, with two refusals.

Everything is real except the hardware: swtpm (libtpms) emulates the TPMs and swtpm_localca
plays the TPM vendor's CA. The verifier is the same `attest` code the join service uses.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from attest import pcr, tpm
from bootstrap import swtpm
from bootstrap.agent import Agent

SELECTION = "sha256:0,1,2,3,4,5,6,7"


def _step(n: int, text: str) -> None:
    print(f"[{n}] {text}", flush=True)


def attest_node(server: swtpm.Swtpm, ca: swtpm.LocalCa) -> tuple[tpm.EkIdentity, tpm.QuoteResult]:
    """What the join service will do for one node: EK chain, AK checks, credential activation,
    and a quote over a fresh nonce."""
    with Agent(server.tcti) as node:
        ek = node.create_ek("rsa")
        ak = node.create_ak("ecc")
        ek_id = tpm.verify_ek(ek.public, ek.certificate, roots=[ca.root], intermediates=[ca.intermediate])
        ak_id = tpm.verify_ak(ak.public)
        secret = os.urandom(32)
        blob, encrypted = tpm.make_credential(ek.public, ak_id.name, secret)
        proof = tpm.credential_proof(node.activate_credential(ak, ek, blob, encrypted), "demo-session")
        tpm.verify_credential_proof(secret, "demo-session", proof)
        nonce = os.urandom(32)
        quote, sig, values = node.quote_with_pcrs(ak, SELECTION, nonce)
    result = tpm.verify_quote(ak.public, quote, sig, selection=SELECTION, pcrs=values, qualifying_data=nonce)
    return ek_id, result


def tampered_node(server: swtpm.Swtpm, policy: pcr.PcrPolicy) -> list[str]:
    """Extend PCR 7 as an unsigned bootloader would; return the codes of the two refusals."""
    codes = []
    with Agent(server.tcti) as node:
        node.create_ek("rsa")
        ak = node.create_ak("ecc")
        node.extend_pcr(7, hashlib.sha256(b"unsigned bootloader").digest())
        nonce = os.urandom(32)
        quote, sig, values = node.quote_with_pcrs(ak, SELECTION, nonce)
    result = tpm.verify_quote(ak.public, quote, sig, selection=SELECTION, pcrs=values, qualifying_data=nonce)
    verdict = pcr.evaluate(policy, result.pcrs)
    codes.append("accepted" if verdict.ok else "pcr_policy_violation")
    try:
        tpm.verify_quote(
            ak.public, quote, sig, selection=SELECTION, pcrs=values, qualifying_data=os.urandom(32)
        )
        codes.append("accepted")
    except tpm.AttestationError as exc:
        codes.append(exc.code)
    return codes


def run() -> int:
    with tempfile.TemporaryDirectory(prefix="nodegate-demo-") as tmp:
        root = Path(tmp)
        _step(1, "creating a local EK CA and two software TPMs (swtpm: emulated TPM hardware)")
        ca = swtpm.make_ca(root / "xdg")
        servers: list[tuple[str, swtpm.Swtpm]] = []
        try:
            for name in ("gpu-node-1", "gpu-node-2"):
                swtpm.manufacture(ca, root / name)
                servers.append((name, swtpm.start(ca, root / name)))
            policy = None
            for n, (name, server) in enumerate(servers, start=2):
                ek_id, result = attest_node(server, ca)
                if policy is None:  # the first node's measurements become the fleet's golden class
                    golden = {i: [v.hex()] for i, v in result.pcrs["sha256"].items()}
                    policy = pcr.policy_from_obj(
                        {"classes": [{"name": "demo-fleet", "golden": {"sha256": golden}}]}
                    )
                verdict = pcr.enforce(policy, result.pcrs)
                _step(
                    n,
                    f"{name}: EK {ek_id.sha256[:16]}... ({ek_id.template}, trusted by {ek_id.trusted_by}); "
                    f"AK bound by credential activation; quote verified; PCR class {verdict.matched_class}",
                )
            assert policy is not None  # noqa: S101  (set by the loop above)
            name, server = servers[1]
            policy_code, replay_code = tampered_node(server, policy)
            _step(4, f"{name} after a tampered boot (PCR 7 extended): {policy_code}")
            _step(5, f"{name} replaying that quote against a fresh nonce: {replay_code}")
        finally:
            for _, server in servers:
                server.stop()
    print("demo complete. The join service, hold gate and webhook demos arrive with issues 3-6.")
    return 0
