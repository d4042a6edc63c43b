"""The attest benchmark's evidence (``tests.bench.attest``): one swtpm's EKs, AKs, quotes and
credentials checked by ActivateCredential, keylime's and tpm2-pytss's MakeCredential, and the PCR
blob keylime's checkquote takes."""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attest import tpm, wire

SELECTION = "sha256:0,1,2,3,4,5,6,7"

OURS, KEYLIME, PYTSS, FLOOR, FLOOR_COLD = "ours", "keylime", "tpm2-pytss", "floor", "floor-cold"


@dataclass(frozen=True)
class QuoteEvidence:
    ak_public: bytes
    quote: bytes
    signature: bytes
    pcrs: dict[str, dict[int, bytes]]
    nonce: bytes


@dataclass(frozen=True)
class CredentialInput:
    ek_public: bytes
    ak_name: bytes  # the AK that was loaded beside this EK when the outputs were activated
    broken: dict[str, str]  # implementation -> why it is skipped (raised, or did not activate)


@dataclass(frozen=True)
class Evidence:
    quotes: dict[str, QuoteEvidence]  # AK kind "ecc" / "rsa"
    credentials: dict[str, CredentialInput]  # EK kind "rsa" / "ecc"
    ek_templates: dict[str, str]


def quiet_keylime() -> Any:
    """Import keylime's tpm_util without its missing-config warning and deprecation noise."""
    logging.getLogger("keylime").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"keylime(\.|$)")
    warnings.filterwarnings("ignore", module=r"tpm2_pytss(\.|$)")
    tpm_util = importlib.import_module("keylime.tpm.tpm_util")  # untyped; used through Any
    logging.getLogger("keylime").setLevel(logging.ERROR)
    return tpm_util


def _keylime_credential(
    tpm_util: Any, ek_public: bytes, ak_name: bytes, secret: bytes
) -> tuple[bytes, bytes]:
    """keylime's makecredential; its tpm2-tools output split into the two TPM2B structures."""
    out = tpm_util.makecredential(ek_public, secret, ak_name)
    if out[:8] != struct.pack(">II", 0xBADCC0DE, 1):
        raise ValueError("keylime makecredential output lacks the tpm2-tools header")
    (size,) = struct.unpack_from(">H", out, 8)
    return out[8 : 10 + size], out[10 + size :]


def pytss_credential(ek_public: bytes, ak_name: bytes, secret: bytes) -> tuple[bytes, bytes]:
    from tpm2_pytss import TPM2B_PUBLIC
    from tpm2_pytss.utils import make_credential

    blob, enc = make_credential(TPM2B_PUBLIC.unmarshal(ek_public)[0], secret, ak_name)
    return blob.marshal(), enc.marshal()


def _credential_impls(tpm_util: Any) -> dict[str, Callable[[bytes, bytes, bytes], tuple[bytes, bytes]]]:
    return {
        OURS: tpm.make_credential,
        KEYLIME: lambda ek, name, secret: _keylime_credential(tpm_util, ek, name, secret),
        PYTSS: pytss_credential,
    }


def _check_credentials(node: Any, ek: Any, ak: Any, tpm_util: Any) -> tuple[bytes, dict[str, str]]:
    """Activate each implementation's credential on the TPM; return the AK name and what failed."""
    from tpm2_pytss import TPM2B_PUBLIC

    ak_name = tpm.verify_ak(ak.public).name
    if bytes(TPM2B_PUBLIC.unmarshal(ak.public)[0].get_name()) != ak_name:
        raise RuntimeError("tpm2-pytss and attest.tpm disagree on the AK name")
    broken: dict[str, str] = {}
    for impl, make in _credential_impls(tpm_util).items():
        secret = os.urandom(32)
        try:
            blob, enc = make(ek.public, ak_name, secret)
        except Exception as exc:  # noqa: BLE001  any failure of a third-party implementation is a skip
            broken[impl] = f"raised {type(exc).__name__}: {exc}"
            continue
        try:
            recovered = node.activate_credential(ak, ek, blob, enc)
            why = "" if recovered == secret else "output activated to a different secret"
        except Exception as exc:  # noqa: BLE001
            why = f"output did not activate ({exc})"
        if why and impl == OURS:
            raise RuntimeError(f"attest.tpm.make_credential is wrong for the {ek.template} EK: {why}")
        if why:
            broken[impl] = why
    return ak_name, broken


def collect_evidence(workdir: Path, tpm_util: Any) -> Evidence:
    """Manufacture one swtpm and take the EKs, AKs, quotes and checked credentials from it."""
    from bootstrap.demo import swtpm
    from bootstrap.node.tpm import Agent, AkKind, EkKind

    pairs: tuple[tuple[EkKind, AkKind], ...] = (("rsa", "ecc"), ("ecc", "rsa"))
    ca = swtpm.make_ca(workdir / "xdg")
    swtpm.manufacture(ca, workdir / "tpm")
    server = swtpm.start(ca, workdir / "tpm")
    quotes: dict[str, QuoteEvidence] = {}
    credentials: dict[str, CredentialInput] = {}
    templates: dict[str, str] = {}
    try:
        with Agent(server.tcti) as node:  # distinct PCR values, so a wrongly ordered blob shows
            for i in range(8):
                node.extend_pcr(i, hashlib.sha256(b"nodegate bench PCR %d" % i).digest())
        # swtpm has three transient object slots: one EK and one AK per session.
        for ek_kind, ak_kind in pairs:
            with Agent(server.tcti) as node:
                ek = node.create_ek(ek_kind)
                ak = node.create_ak(ak_kind)
                nonce = os.urandom(32)
                quote, signature = node.quote(ak, SELECTION, nonce)
                pcrs = node.read_pcrs(SELECTION)
                quotes[ak_kind] = QuoteEvidence(ak.public, quote, signature, pcrs, nonce)
                ak_name, broken = _check_credentials(node, ek, ak, tpm_util)
                credentials[ek_kind] = CredentialInput(ek.public, ak_name, broken)
                templates[ek_kind] = ek.template
    finally:
        server.stop()
    return Evidence(quotes, credentials, templates)


def tpm2_tools_pcr_blob(pcrs: dict[str, dict[int, bytes]]) -> bytes:
    """The in-memory (little-endian, unmarshalled) blob tpm2-tools writes for a PCR read, which
    keylime's checkquote takes: TPML_PCR_SELECTION with 16 fixed entries, then TPML_DIGESTs of
    8 fixed TPM2B_DIGEST slots each. keylime reads one bank only."""
    if len(pcrs) != 1:
        raise ValueError("keylime's PCR blob parser handles exactly one bank")
    ((bank, values),) = pcrs.items()
    mask = 0
    for i in values:
        mask |= 1 << i
    out = bytearray(struct.pack("<I", 1))
    out += struct.pack("<HB", wire.BANK_NAMES[bank], 3) + mask.to_bytes(3, "little") + bytes(2)
    out += bytes(8 * 15)  # the 15 unused TPMS_PCR_SELECTION slots
    ordered = [values[i] for i in sorted(values)]
    groups = [ordered[i : i + 8] for i in range(0, len(ordered), 8)]
    out += struct.pack("<I", len(groups))
    for group in groups:
        out += struct.pack("<I", len(group))
        for slot in range(8):
            digest = group[slot] if slot < len(group) else b""
            out += struct.pack("<H", len(digest)) + digest.ljust(64, b"\x00")
    return bytes(out)
