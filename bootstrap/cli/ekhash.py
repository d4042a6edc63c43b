"""``nodegate ek hash``: the SHA-256 of a TPM's EK SubjectPublicKeyInfo (DER), the value
``ek_allowlist``, ``ek_denylist`` and ``inventory[].ek_sha256`` take, read from this machine's TPM
or from an EK certificate file (or a TPM2B_PUBLIC, e.g. from ``tpm2_readpublic -o``). The same
digest the service computes for the EK it is shown.

Exit codes: 0, 2 (usage, unreadable file, no TPM)."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from attest import certparse
from attest.errors import AttestationError
from attest.identity import ek_digest
from attest.keys import spki_der
from bootstrap.node.errors import JoinUsageError
from bootstrap.node.tcti import check as tcti_check

EXIT_USAGE = 2
_MAX_INPUT = 64 * 1024


class _Usage(Exception):
    pass


def run(args: argparse.Namespace) -> int:
    try:
        out = _from_file(args.file) if args.file is not None else _from_tpm(args.tcti, args.ek)
    except _Usage as exc:
        print(f"nodegate ek hash: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if out.get("ca"):
        # a root or intermediate hashes fine, but no TPM's EK will ever have that key
        print(
            f"nodegate ek hash: warning: {args.file} is a CA certificate (basicConstraints CA:TRUE), "
            "not an EK certificate: no TPM's EK has this hash",
            file=sys.stderr,
        )
    if args.output == "json":
        print(json.dumps(out, sort_keys=True))
    else:
        print(out["ek_sha256"])
    return 0


def _read(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_INPUT + 1)
    except OSError as exc:
        raise _Usage(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > _MAX_INPUT:
        raise _Usage(f"{path} is larger than {_MAX_INPUT} bytes")
    return data


def digest_of_file(data: bytes) -> tuple[str, str]:
    """(hex digest, what the file was): an EK certificate (PEM or DER, ``certificate``, or
    ``ca-certificate`` for a CA's), or a TPM2B_PUBLIC."""
    if certparse.is_pem(data):
        blocks = list(certparse.pem_blocks(data))
        if len(blocks) != 1:
            raise _Usage(f"expected one CERTIFICATE block, found {len(blocks)}")
        data = blocks[0]
    try:
        cert = certparse.read_certificate(data, "EK certificate", trailing=certparse.FILE_WHITESPACE)
    except AttestationError as cert_exc:
        try:
            return ek_digest(data), "tpm2b_public"
        except AttestationError:
            raise _Usage(f"neither an EK certificate nor a TPM2B_PUBLIC ({cert_exc.detail})") from None
    if not isinstance(cert.key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        raise _Usage("the certificate holds neither an RSA nor an ECC key")
    return hashlib.sha256(spki_der(cert.key)).hexdigest(), "ca-certificate" if _is_ca(cert) else "certificate"


def _is_ca(cert: certparse.Cert) -> bool:
    try:
        return bool(cert.view.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except (x509.ExtensionNotFound, ValueError):
        return False


def _from_file(path: Path) -> dict[str, Any]:
    digest, kind = digest_of_file(_read(path))
    out: dict[str, Any] = {"ek_sha256": digest, "source": "certificate" if kind == "ca-certificate" else kind}
    if kind == "ca-certificate":
        out["ca"] = True
    return {**out, "file": str(path)}


def _from_tpm(tcti: str, kind: str) -> dict[str, Any]:
    # the TPM stack loads only for this branch (``nodegate ek hash FILE`` works without it)
    from bootstrap.node.tpm import Agent, TpmError  # noqa: PLC0415

    try:
        tcti_check(tcti)
    except JoinUsageError as exc:
        raise _Usage(str(exc)) from None
    try:
        with Agent(tcti) as agent:
            ek = agent.create_ek("ecc" if kind == "ecc" else "rsa")
    except TpmError as exc:
        raise _Usage(str(exc)) from None
    return {
        "ek_sha256": ek_digest(ek.public),
        "source": "tpm",
        "tcti": tcti,
        "template": ek.template,
        "has_certificate": ek.certificate is not None,
    }
