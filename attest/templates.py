"""The TCG EK Credential Profile templates an EK must follow.

An EK created from one of these templates is a restricted decryption key that only the TPM can
use, under the endorsement hierarchy's policy. A key that merely *claims* to be an EK but deviates
(signing allowed, userWithAuth on a low-range template, another policy or symmetric cipher) gives
no assurance that MakeCredential's secret stays inside a TPM, so it is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from attest.errors import EkUntrusted
from attest.wire import Alg, Curve, ObjectAttr, Public

# PolicySecret(TPM_RH_ENDORSEMENT) for SHA-256 (policy A), and PolicyOR(A, C) for the high range.
POLICY_A_SHA256 = bytes.fromhex("837197674484b3f81a90cc8d46a5d724fd52d76e06520b64f2a1da1b331469aa")
POLICY_B_SHA256 = bytes.fromhex("ca3d0a99a2b93906f7a3342414efcfb3a385d44cd1fd459089d19b5071c0b7a0")
POLICY_B_SHA384 = bytes.fromhex(
    "b26e7d28d11a50bc53d882bcf5fd3a1a074148bb35d3b4e4cb1c0ad9bde419cacb47ba09699646150f9fc000f3f80e12"
)

_LOW_ATTRS = (
    ObjectAttr.FIXED_TPM
    | ObjectAttr.FIXED_PARENT
    | ObjectAttr.SENSITIVE_DATA_ORIGIN
    | ObjectAttr.ADMIN_WITH_POLICY
    | ObjectAttr.RESTRICTED
    | ObjectAttr.DECRYPT
)
_HIGH_ATTRS = _LOW_ATTRS | ObjectAttr.USER_WITH_AUTH


@dataclass(frozen=True, slots=True)
class EkTemplate:
    name: str
    type: int
    name_alg: int
    attributes: int
    auth_policy: bytes
    sym_bits: int
    rsa_bits: int = 0
    curve: int = 0


EK_TEMPLATES: tuple[EkTemplate, ...] = (
    EkTemplate("L-1 RSA-2048", Alg.RSA, Alg.SHA256, _LOW_ATTRS, POLICY_A_SHA256, 128, rsa_bits=2048),
    EkTemplate("L-2 ECC-P256", Alg.ECC, Alg.SHA256, _LOW_ATTRS, POLICY_A_SHA256, 128, curve=Curve.NIST_P256),
    EkTemplate("H-1 RSA-2048", Alg.RSA, Alg.SHA256, _HIGH_ATTRS, POLICY_B_SHA256, 128, rsa_bits=2048),
    EkTemplate("H-2 ECC-P256", Alg.ECC, Alg.SHA256, _HIGH_ATTRS, POLICY_B_SHA256, 128, curve=Curve.NIST_P256),
    EkTemplate("H-3 ECC-P384", Alg.ECC, Alg.SHA384, _HIGH_ATTRS, POLICY_B_SHA384, 256, curve=Curve.NIST_P384),
)


def match_ek_template(pub: Public) -> EkTemplate:
    """Return the template ``pub`` was created from, or raise EkUntrusted saying why not."""
    candidates = [t for t in EK_TEMPLATES if t.type == pub.type and t.name_alg == pub.name_alg]
    if pub.type == Alg.RSA:
        candidates = [t for t in candidates if t.rsa_bits == pub.rsa_bits]
    else:
        candidates = [t for t in candidates if t.curve == pub.curve]
    if not candidates:
        raise EkUntrusted(
            "EK key type, size or name algorithm matches no TCG EK template "
            "(RSA-2048/SHA-256, ECC P-256/SHA-256, ECC P-384/SHA-384)"
        )
    problems: list[str] = []
    for t in candidates:
        why = _deviation(pub, t)
        if why is None:
            return t
        problems.append(f"{t.name}: {why}")
    raise EkUntrusted("EK public area is not a standard EK (" + "; ".join(problems) + ")")


def _deviation(pub: Public, t: EkTemplate) -> str | None:
    if pub.attributes != t.attributes:
        return f"attributes 0x{pub.attributes:08x}, expected 0x{t.attributes:08x}"
    if pub.auth_policy != t.auth_policy:
        return "authPolicy is not the endorsement-hierarchy policy"
    if (pub.sym_alg, pub.sym_bits, pub.sym_mode) != (Alg.AES, t.sym_bits, Alg.CFB):
        return f"symmetric is not AES-{t.sym_bits}-CFB"
    if pub.scheme != Alg.NULL:
        return "a scheme is set; an EK has the NULL scheme"
    if pub.type == Alg.RSA and pub.rsa_exponent not in (0, 65537):
        return f"RSA exponent {pub.rsa_exponent} is not the default"
    if pub.type == Alg.ECC and pub.kdf != Alg.NULL:
        return "a KDF is set; an EK has the NULL KDF"
    return None
