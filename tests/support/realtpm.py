"""Real TPM evidence from the public test data's ``tpm/`` folder (not committed: read through
tests/support/shared_data.py, each file checked against its manifest.json with source, SHA-256,
licence and date fetched), and the little decoding the tests need.

go-tpm-tools publishes its GCE attestations as protobuf ``attest.Attestation`` messages; the few
fields used here are read by :func:`gce_attestation` (protobuf wire format: varint keys, length-
delimited fields), with the limits and trailing-byte checks every parser of ours has.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec, rsa

from attest import certparse
from attest.templates import POLICY_A_SHA256
from attest.wire import Alg
from tests.support import fakes
from tests.support.shared_data import shared

TPM = shared("tpm")
# Firmware event logs have one home, with their own manifest (tests/attest/test_reallogs.py).
FIRMWARE_LOGS = shared("eventlogs")
_MAX_MESSAGE = 1 << 20
_EK_SYM = b"\x00\x06\x00\x80\x00\x43"  # AES-128-CFB, as the TCG EK templates have it


def manifest() -> dict[str, dict[str, Any]]:
    """file -> its manifest entry."""
    return TPM.manifest()


def data(name: str) -> bytes:
    """A file's bytes, refused unless they are the bytes the manifest records."""
    return TPM.read(name)


def firmware_log(name: str) -> bytes:
    """A real firmware event log (``eventlogs/``), refused unless it is the file its MANIFEST.json
    records."""
    return FIRMWARE_LOGS.read(name)


def named(kind: str, vendor: str | None = None) -> list[str]:
    return sorted(
        f for f, e in manifest().items() if e["kind"] == kind and (vendor is None or e["vendor"] == vendor)
    )


def certificate_bytes(name: str) -> bytes:
    """What a node would send: the DER as read from NV (PEM fixtures are unwrapped)."""
    raw = data(name)
    return next(certparse.pem_blocks(raw)) if certparse.is_pem(raw) else raw


def valid_at(cert: certparse.Cert) -> datetime:
    """A time at which the genuine chain was valid: one day after the certificate was issued."""
    return cert.view.not_valid_before_utc + timedelta(days=1)


def ek_public_for(key: object) -> bytes:
    """The TPM2B_PUBLIC of an EK created from the TCG default template (L-1 RSA-2048 or L-2 ECC
    P-256) whose key is ``key``: the public area is fixed by the template except for the key."""
    if isinstance(key, rsa.RSAPublicKey):
        return fakes.rsa_ek_public(key)
    if isinstance(key, ec.EllipticCurvePublicKey):
        return fakes.ecc_public(
            key, attrs=0x000300B2, scheme=Alg.NULL, policy=POLICY_A_SHA256, sym=_EK_SYM, kdf=Alg.NULL
        )
    raise TypeError(f"not an EK key type: {type(key).__name__}")


# -- protobuf (go-tpm-tools attest.Attestation) ----------------------------------------------------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) of one message: varints as int, length-delimited fields as bytes."""
    if len(buf) > _MAX_MESSAGE:
        raise ValueError("message too large")
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _varint(buf, pos)
            out.append((number, value))
        elif wire_type == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise ValueError(f"field {number} runs past the end")
            out.append((number, buf[pos : pos + size]))
            pos += size
        else:
            raise ValueError(f"field {number}: wire type {wire_type} is not used by these messages")
    return out


def _one(items: list[tuple[int, int | bytes]], number: int) -> bytes:
    found = [v for n, v in items if n == number and isinstance(v, bytes)]
    if len(found) != 1:
        raise ValueError(f"expected one field {number}, found {len(found)}")
    return found[0]


_BANKS = {Alg.SHA1: "sha1", Alg.SHA256: "sha256", Alg.SHA384: "sha384", Alg.SHA512: "sha512"}


@dataclass(frozen=True)
class Quote:
    bank: str
    quote: bytes  # TPM2B_ATTEST contents (TPMS_ATTEST)
    signature: bytes  # TPMT_SIGNATURE
    pcrs: dict[int, bytes]

    @property
    def selection(self) -> str:
        return f"{self.bank}:" + ",".join(str(i) for i in sorted(self.pcrs))


@dataclass(frozen=True)
class Attestation:
    ak_public: bytes  # TPM2B_PUBLIC (the message carries a bare TPMT_PUBLIC)
    quotes: tuple[Quote, ...]
    event_log: bytes
    ak_certificate: bytes | None


def gce_attestation(raw: bytes) -> Attestation:
    """ak_pub = 1, quotes = 2 (quote = 1, raw_sig = 2, pcrs = 3 {hash = 1, map<uint32, bytes> = 2}),
    event_log = 3, ak_cert = 6 (go-tpm-tools proto/attest.proto and proto/tpm.proto)."""
    top = fields(raw)
    ak = _one(top, 1)
    quotes = []
    for number, value in top:
        if number != 2 or not isinstance(value, bytes):
            continue
        q = fields(value)
        pcr_msg = fields(_one(q, 3))
        algs = [v for n, v in pcr_msg if n == 1 and isinstance(v, int)]
        pcrs: dict[int, bytes] = {}
        for n, entry in pcr_msg:
            if n == 2 and isinstance(entry, bytes):
                kv = dict(fields(entry))
                index, digest = kv.get(1, 0), kv.get(2, b"")
                if not isinstance(index, int) or not isinstance(digest, bytes) or index in pcrs:
                    raise ValueError("bad PCR map entry")
                pcrs[index] = digest
        quotes.append(Quote(_BANKS[Alg(algs[0])], _one(q, 1), _one(q, 2), pcrs))
    certs = [v for n, v in top if n == 6 and isinstance(v, bytes)]
    return Attestation(
        len(ak).to_bytes(2, "big") + ak, tuple(quotes), _one(top, 3), certs[0] if certs else None
    )


@dataclass(frozen=True)
class WindowsAttestation:
    ak_public: bytes
    quote: bytes
    signature: bytes
    pcrs: dict[int, bytes]  # SHA-1
    event_log: bytes


def windows_attestation(raw: bytes) -> WindowsAttestation:
    """go-attestation's JSON test vector (AK.Public is a bare TPMT_PUBLIC; base64 throughout)."""
    doc = json.loads(raw)
    ak = base64.b64decode(doc["AK"]["Public"])
    if {p["DigestAlg"] for p in doc["Log"]["PCRs"]} != {3}:  # Go's crypto.SHA1
        raise ValueError("expected SHA-1 PCRs")
    return WindowsAttestation(
        len(ak).to_bytes(2, "big") + ak,
        base64.b64decode(doc["Quote"]["Quote"]),
        base64.b64decode(doc["Quote"]["Signature"]),
        {p["Index"]: base64.b64decode(p["Digest"]) for p in doc["Log"]["PCRs"]},
        base64.b64decode(doc["Log"]["Raw"]),
    )
