"""Command line: `nodegate` and `kubectl-nodegate`.

Only `nodegate demo` does real work so far (the attestation core on software TPMs); the service,
join client, gate and policy commands arrive with their issues and say so when called.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

_PENDING = {
    "serve": "the join service (issue 3)",
    "join": "the node join client (issue 3)",
    "gate": "the hold-taint controller (issue 4)",
    "policy": "admission policy tools (issue 5)",
    "ca": "CA rotation (issue 3)",
    "backup": "backup and restore (issue 6)",
    "restore": "backup and restore (issue 6)",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nodegate",
        description="TPM-attested node bootstrap, hold gate and package admission for GPU fleets.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("demo", help="attest software TPMs locally and show a refused one")
    for name, what in _PENDING.items():
        sub.add_parser(name, help=f"{what}; not built yet")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "demo":
        return demo()
    print(f"nodegate {args.command}: {_PENDING[args.command]} is not built yet.", file=sys.stderr)
    return 2


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kubectl nodegate", description="Why nodes are held.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("status", help="nodes, hold reasons and what each waits for; not built yet")
    args = p.parse_args(argv)
    if args.command is None:
        p.print_help()
        return 0
    print("kubectl nodegate status: arrives with the hold gate (issue 4).", file=sys.stderr)
    return 2


def _step(n: int, text: str) -> None:
    print(f"[{n}] {text}", flush=True)


def demo() -> int:
    """Manufacture two software TPMs, attest them with the real verifier, then show that a
    quote over a tampered PCR and a replayed quote are refused with their machine codes."""
    os.environ.setdefault("TSS2_LOG", "all+none")
    from attest import pcr, tpm  # noqa: PLC0415
    from bootstrap import swtpm  # noqa: PLC0415
    from bootstrap.agent import Agent  # noqa: PLC0415

    selection = "sha256:0,1,2,3,4,5,6,7"
    with tempfile.TemporaryDirectory(prefix="nodegate-demo-") as tmp:
        root = Path(tmp)
        _step(1, "creating a local EK CA and two software TPMs (swtpm, emulated hardware)")
        ca = swtpm.make_ca(root / "xdg")
        servers = []
        try:
            for name in ("gpu-node-1", "gpu-node-2"):
                swtpm.manufacture(ca, root / name)
                servers.append((name, swtpm.start(ca, root / name)))
            policy = None
            for n, (name, server) in enumerate(servers, start=2):
                with Agent(server.tcti) as node:
                    ek = node.create_ek("rsa")
                    ak = node.create_ak("ecc")
                    ek_id = tpm.verify_ek(ek.public, ek.certificate, roots=[ca.root, ca.intermediate])
                    ak_id = tpm.verify_ak(ak.public)
                    secret = os.urandom(32)
                    blob, enc = tpm.make_credential(ek.public, ak_id.name, secret)
                    recovered = node.activate_credential(ak, ek, blob, enc)
                    tpm.verify_credential_proof(secret, "demo", tpm.credential_proof(recovered, "demo"))
                    nonce = os.urandom(32)
                    quote, sig = node.quote(ak, selection, nonce)
                    values = node.read_pcrs(selection)
                    result = tpm.verify_quote(
                        ak.public, quote, sig, selection=selection, pcrs=values, qualifying_data=nonce
                    )
                    if policy is None:  # the first node's measurements become the golden class
                        golden = {i: [v.hex()] for i, v in values["sha256"].items()}
                        policy = pcr.policy_from_obj(
                            {"classes": [{"name": "demo-fleet", "golden": {"sha256": golden}}]}
                        )
                    verdict = pcr.enforce(policy, result.pcrs)
                    _step(
                        n,
                        f"{name}: EK {ek_id.sha256[:16]}... ({ek_id.template}, {ek_id.trusted_by}), "
                        f"AK bound by credential activation, quote verified "
                        f"(resetCount {result.counters.reset_count}), PCR class {verdict.matched_class}",
                    )
            name, server = servers[1]
            with Agent(server.tcti) as node:
                ek = node.create_ek("rsa")
                ak = node.create_ak("ecc")
                node.extend_pcr(7, hashlib.sha256(b"unsigned bootloader").digest())
                nonce = os.urandom(32)
                quote, sig = node.quote(ak, selection, nonce)
                values = node.read_pcrs(selection)
                result = tpm.verify_quote(
                    ak.public, quote, sig, selection=selection, pcrs=values, qualifying_data=nonce
                )
                try:
                    assert policy is not None
                    pcr.enforce(policy, result.pcrs)
                except tpm.AttestationError as exc:
                    _step(4, f"{name} after a tampered boot (PCR 7 extended): refused, code {exc.code}")
                try:
                    tpm.verify_quote(
                        ak.public, quote, sig, selection=selection, pcrs=values, qualifying_data=os.urandom(32)
                    )
                except tpm.AttestationError as exc:
                    _step(5, f"{name} replaying that quote against a fresh nonce: refused, code {exc.code}")
        finally:
            for _, server in servers:
                server.stop()
    print("demo complete: the join service, gate and webhook demos arrive with issues 3-6.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
