"""TPM public areas as `cryptography` keys, their SubjectPublicKeyInfo and their TPM names."""

from __future__ import annotations

import hashlib

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from attest.errors import MalformedInput
from attest.wire import Alg, Curve, Public

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey

CURVES: dict[int, ec.EllipticCurve] = {
    Curve.NIST_P256: ec.SECP256R1(),
    Curve.NIST_P384: ec.SECP384R1(),
    Curve.NIST_P521: ec.SECP521R1(),
}
CURVE_BYTES: dict[int, int] = {Curve.NIST_P256: 32, Curve.NIST_P384: 48, Curve.NIST_P521: 66}
HASHLIB_NAMES: dict[int, str] = {
    Alg.SHA1: "sha1",
    Alg.SHA256: "sha256",
    Alg.SHA384: "sha384",
    Alg.SHA512: "sha512",
}
CRYPTO_HASHES: dict[int, type[hashes.HashAlgorithm]] = {
    Alg.SHA1: hashes.SHA1,
    Alg.SHA256: hashes.SHA256,
    Alg.SHA384: hashes.SHA384,
    Alg.SHA512: hashes.SHA512,
}


def hashlib_name(alg: int) -> str:
    name = HASHLIB_NAMES.get(alg)
    if name is None:
        raise MalformedInput(f"hash algorithm 0x{alg:04x} is not supported")
    return name


def object_name(pub: Public) -> bytes:
    """The TPM name: nameAlg (2 bytes) || H_nameAlg(TPMT_PUBLIC)."""
    return pub.name_alg.to_bytes(2, "big") + hashlib.new(hashlib_name(pub.name_alg), pub.area).digest()


def public_key(pub: Public) -> PublicKey:
    """The `cryptography` key for an RSA or ECC public area; raises MalformedInput if the key
    material is not a valid key (wrong modulus length, point not on the curve)."""
    try:
        if pub.type == Alg.RSA:
            if pub.rsa_bits not in (1024, 2048, 3072, 4096) or len(pub.rsa_modulus) * 8 != pub.rsa_bits:
                raise MalformedInput(
                    f"RSA modulus of {len(pub.rsa_modulus)} bytes does not match keyBits {pub.rsa_bits}"
                )
            exponent = pub.rsa_exponent or 65537  # 0 means the default exponent
            n = int.from_bytes(pub.rsa_modulus, "big")
            return rsa.RSAPublicNumbers(exponent, n).public_key()
        curve = CURVES.get(pub.curve)
        if curve is None:
            raise MalformedInput(f"unsupported ECC curve 0x{pub.curve:04x}")
        size = CURVE_BYTES[pub.curve]
        if len(pub.ecc_x) != size or len(pub.ecc_y) != size:
            raise MalformedInput(f"ECC point coordinates are not {size} bytes")
        point = b"\x04" + pub.ecc_x + pub.ecc_y
        return ec.EllipticCurvePublicKey.from_encoded_point(curve, point)
    except ValueError as exc:  # cryptography's verdict on bad key material
        raise MalformedInput(f"invalid public key: {exc}") from exc


def spki_der(key: PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
