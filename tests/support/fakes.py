"""Software stand-ins for TPM output, for checks a real TPM will not let us provoke.

A restricted TPM key never signs a forged TPMS_ATTEST, and swtpm will not report an unsafe clock
on demand. To show that the verifier refuses such evidence we build the structures here and sign
them with a software key whose public area *claims* the AK attributes: exactly what an attacker
without a TPM would try, and why credential activation is needed on top of these checks.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from attest.wire import (
    TPM_GENERATED_VALUE,
    TPM_ST_ATTEST_QUOTE,
    Alg,
    Curve,
    ObjectAttr,
    Selection,
    marshal_selection,
    parse_selection_string,
    tpm2b,
)

AK_ATTRS = (
    ObjectAttr.RESTRICTED
    | ObjectAttr.SIGN
    | ObjectAttr.FIXED_TPM
    | ObjectAttr.FIXED_PARENT
    | ObjectAttr.SENSITIVE_DATA_ORIGIN
    | ObjectAttr.USER_WITH_AUTH
)
_HASHES = {Alg.SHA1: hashes.SHA1, Alg.SHA256: hashes.SHA256, Alg.SHA384: hashes.SHA384}


def ecc_public(
    key: ec.EllipticCurvePublicKey,
    *,
    attrs: int = AK_ATTRS,
    scheme: int = Alg.ECDSA,
    scheme_hash: int = Alg.SHA256,
    name_alg: int = Alg.SHA256,
    sym: bytes = b"",
    kdf: int = Alg.NULL,
    policy: bytes = b"",
) -> bytes:
    """Marshalled TPM2B_PUBLIC for an ECC key (P-256, P-384 or P-521)."""
    size = key.curve.key_size // 8 + (1 if key.curve.key_size % 8 else 0)
    curve = {256: Curve.NIST_P256, 384: Curve.NIST_P384, 521: Curve.NIST_P521}[key.curve.key_size]
    nums = key.public_numbers()
    scheme_part = struct.pack(">H", scheme) + (struct.pack(">H", scheme_hash) if scheme != Alg.NULL else b"")
    area = (
        struct.pack(">HHI", Alg.ECC, name_alg, attrs)
        + tpm2b(policy)
        + (sym or struct.pack(">H", Alg.NULL))
        + scheme_part
        + struct.pack(">HH", curve, kdf)
        + (struct.pack(">H", Alg.SHA256) if kdf != Alg.NULL else b"")
        + tpm2b(nums.x.to_bytes(size, "big"))
        + tpm2b(nums.y.to_bytes(size, "big"))
    )
    return tpm2b(area)


def rsa_public(
    key: rsa.RSAPublicKey,
    *,
    attrs: int = AK_ATTRS,
    scheme: int = Alg.RSASSA,
    scheme_hash: int = Alg.SHA256,
    name_alg: int = Alg.SHA256,
    sym: bytes = b"",
    policy: bytes = b"",
) -> bytes:
    nums = key.public_numbers()
    scheme_part = struct.pack(">H", scheme) + (struct.pack(">H", scheme_hash) if scheme != Alg.NULL else b"")
    area = (
        struct.pack(">HHI", Alg.RSA, name_alg, attrs)
        + tpm2b(policy)
        + (sym or struct.pack(">H", Alg.NULL))
        + scheme_part
        + struct.pack(">HI", key.key_size, 0 if nums.e == 65537 else nums.e)
        + tpm2b(nums.n.to_bytes(key.key_size // 8, "big"))
    )
    return tpm2b(area)


@dataclass
class FakeQuote:
    """Fields of a TPMS_ATTEST quote; ``build()`` marshals them."""

    extra_data: bytes
    selection: Selection = field(default_factory=lambda: parse_selection_string("sha256:0,1,2,3,4,5,6,7"))
    pcr_digest: bytes = b""
    magic: int = TPM_GENERATED_VALUE
    type: int = TPM_ST_ATTEST_QUOTE
    qualified_signer: bytes = b"\x00\x0b" + bytes(32)
    clock: int = 1_000_000
    reset_count: int = 3
    restart_count: int = 0
    safe: int = 1
    firmware_version: int = 0x2019102300163636
    raw_selection: bytes | None = None  # overrides ``selection`` with hand-made bytes

    def build(self) -> bytes:
        sel = self.raw_selection if self.raw_selection is not None else marshal_selection(self.selection)
        return (
            struct.pack(">IH", self.magic, self.type)
            + tpm2b(self.qualified_signer)
            + tpm2b(self.extra_data)
            + struct.pack(
                ">QIIBQ", self.clock, self.reset_count, self.restart_count, self.safe, self.firmware_version
            )
            + sel
            + tpm2b(self.pcr_digest)
        )


def pcr_digest(values: dict[int, bytes]) -> bytes:
    h = hashlib.sha256()
    for i in sorted(values):
        h.update(values[i])
    return h.digest()


def sign_ecdsa(key: ec.EllipticCurvePrivateKey, data: bytes, hash_alg: int = Alg.SHA256) -> bytes:
    """Marshalled TPMT_SIGNATURE (ECDSA) over ``data``."""
    der = key.sign(data, ec.ECDSA(_HASHES[hash_alg]()))
    r, s = decode_dss_signature(der)
    size = (key.curve.key_size + 7) // 8
    return (
        struct.pack(">HH", Alg.ECDSA, hash_alg)
        + tpm2b(r.to_bytes(size, "big"))
        + tpm2b(s.to_bytes(size, "big"))
    )


def sign_rsassa(key: rsa.RSAPrivateKey, data: bytes, hash_alg: int = Alg.SHA256) -> bytes:
    sig = key.sign(data, padding.PKCS1v15(), _HASHES[hash_alg]())
    return struct.pack(">HH", Alg.RSASSA, hash_alg) + tpm2b(sig)


@dataclass
class SoftAk:
    """A software key posing as an ECDSA P-256 AK."""

    key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))

    @property
    def public(self) -> bytes:
        return ecc_public(self.key.public_key())

    def sign(self, data: bytes, hash_alg: int = Alg.SHA256) -> bytes:
        return sign_ecdsa(self.key, data, hash_alg)

    @property
    def qualified_name(self) -> bytes:
        """As if the key were a primary of the endorsement hierarchy (what the verifier expects)."""
        from attest import keys, tpm, wire

        name = keys.object_name(wire.parse_public(self.public))
        return tpm.qualified_name(tpm.TPM_RH_ENDORSEMENT.to_bytes(4, "big"), name)

    def fake(self, extra_data: bytes, **fields: object) -> FakeQuote:
        """A quote structure this key would produce, with ``fields`` overridden."""
        fields.setdefault("qualified_signer", self.qualified_name)
        return FakeQuote(extra_data, **fields)  # type: ignore[arg-type]


def standard_pcrs(fill: int = 0) -> dict[str, dict[int, bytes]]:
    return {"sha256": {i: bytes([fill + i]) * 32 for i in range(8)}}


def rsa_ek_public(key: rsa.RSAPublicKey) -> bytes:
    """A TPM2B_PUBLIC following the TCG L-1 EK template, for a software RSA-2048 key."""
    from attest.templates import POLICY_A_SHA256

    return rsa_public(
        key,
        attrs=0x000300B2,
        scheme=Alg.NULL,
        policy=POLICY_A_SHA256,
        sym=struct.pack(">HHH", Alg.AES, 128, Alg.CFB),
    )
