"""TPM2_ActivateCredential in software (``tests.support.softtpm``): recover the seed with the EK's
private key, check the blob's integrity, decrypt the credential, refusing as a TPM would."""

from __future__ import annotations

import hmac

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

try:  # CFB moved to "decrepit" in cryptography 47; the TPM still mandates it here.
    from cryptography.hazmat.decrepit.ciphers.modes import CFB
except ImportError:  # pragma: no cover - older cryptography
    from cryptography.hazmat.primitives.ciphers.modes import CFB

from attest import keys, wire
from attest.credential import kdfa, kdfe
from attest.wire import Public
from tests.support.softtpm_errors import (
    TPM_RC_ECC_POINT,
    TPM_RC_FAILURE,
    TPM_RC_INTEGRITY,
    TPM_RC_SIZE,
    TPM_RC_VALUE,
    ChallengeMalformed,
    CredentialRefused,
)

OAEP_IDENTITY = padding.OAEP(
    mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(), label=b"IDENTITY\x00"
)
# sizeof(TPMS_ID_OBJECT) and sizeof(TPMU_ENCRYPTED_SECRET) for SHA-256 / RSA-2048 / P-256 TPMs.
_MAX_ID_OBJECT = 2 + 64 + 2 + 64
_MAX_ENCRYPTED_SECRET = 512


def _split_tpm2b(buf: bytes, limit: int, what: str) -> bytes:
    """The payload of a marshalled TPM2B that must cover ``buf`` exactly."""
    if type(buf) is not bytes:
        raise ChallengeMalformed(f"{what} must be bytes", TPM_RC_SIZE)
    if len(buf) < 2 or int.from_bytes(buf[:2], "big") != len(buf) - 2 or len(buf) - 2 > limit:
        raise ChallengeMalformed(f"{what} is not one TPM2B of at most {limit} bytes", TPM_RC_SIZE)
    return buf[2:]


def _decrypt_seed(
    ek_key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, ek: Public, payload: bytes
) -> bytes:
    """CryptSecretDecrypt with the "IDENTITY" label: the seed MakeCredential chose."""
    digest_size = wire.DIGEST_SIZES[ek.name_alg]
    if isinstance(ek_key, rsa.RSAPrivateKey):
        if len(payload) != ek_key.key_size // 8:
            raise CredentialRefused("encrypted seed is not one RSA block", TPM_RC_SIZE)
        try:
            seed = ek_key.decrypt(payload, OAEP_IDENTITY)
        except ValueError:
            # libtpms answers a failed OAEP decode inside ActivateCredential with TPM_RC_FAILURE
            # (format 0), not a parameter error; test_softtpm checks this against swtpm.
            msg = "encrypted seed does not OAEP-decrypt with the EK"
            raise CredentialRefused(msg, TPM_RC_FAILURE) from None
        if len(seed) > digest_size:
            raise CredentialRefused("decrypted seed is longer than the EK name digest", TPM_RC_VALUE)
        return seed
    size = keys.CURVE_BYTES[ek.curve]
    x_len = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else -1
    if x_len < 0 or 2 + x_len + 2 > len(payload):
        raise ChallengeMalformed("encrypted secret is not a TPMS_ECC_POINT", TPM_RC_SIZE)
    x = payload[2 : 2 + x_len]
    y_len = int.from_bytes(payload[2 + x_len : 4 + x_len], "big")
    y = payload[4 + x_len :]
    if y_len != len(y) or x_len > size or y_len > size:
        raise ChallengeMalformed("encrypted secret is not a TPMS_ECC_POINT", TPM_RC_SIZE)
    try:
        point = b"\x04" + x.rjust(size, b"\x00") + y.rjust(size, b"\x00")
        peer = ec.EllipticCurvePublicKey.from_encoded_point(ek_key.curve, point)
        z = ek_key.exchange(ec.ECDH(), peer)
    except ValueError:
        raise CredentialRefused("ephemeral point is not on the EK's curve", TPM_RC_ECC_POINT) from None
    # partyUInfo is the ephemeral x exactly as received; the TPM does not re-pad it.
    return kdfe(keys.hashlib_name(ek.name_alg), z, b"IDENTITY", x, ek.ecc_x, digest_size * 8)


def activate(
    ek_key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey,
    ek_public: bytes,
    object_name: bytes,
    credential_blob: bytes,
    encrypted_secret: bytes,
) -> bytes:
    """TPM2_ActivateCredential for the object named ``object_name`` (nameAlg || digest), with the
    EK's private key; returns the credential. Raises :class:`SoftTpmError`.

    Steps as the TPM does them (Part 1, 24.4 and Part 3, 12.5): recover the seed; derive the
    HMAC key and check the outer integrity over encIdentity || name *before* decrypting anything;
    derive the storage key from the seed and name; AES-CFB decrypt (IV 0) a TPM2B_DIGEST.
    """
    ek = wire.parse_public(ek_public, "ek_public")
    hash_name = keys.hashlib_name(ek.name_alg)
    digest_size = wire.DIGEST_SIZES[ek.name_alg]
    id_object = _split_tpm2b(credential_blob, _MAX_ID_OBJECT, "credential blob")
    payload = _split_tpm2b(encrypted_secret, _MAX_ENCRYPTED_SECRET, "encrypted secret")
    if len(id_object) < 2 or 2 + int.from_bytes(id_object[:2], "big") > len(id_object):
        raise ChallengeMalformed("credential blob does not start with a TPM2B_DIGEST", TPM_RC_SIZE)
    hmac_len = int.from_bytes(id_object[:2], "big")
    integrity, enc_identity = id_object[2 : 2 + hmac_len], id_object[2 + hmac_len :]
    seed = _decrypt_seed(ek_key, ek, payload)
    if hmac_len != digest_size:
        raise CredentialRefused("credential blob integrity has the wrong size", TPM_RC_INTEGRITY)
    hmac_key = kdfa(hash_name, seed, b"INTEGRITY", b"", b"", digest_size * 8)
    expected = hmac.digest(hmac_key, enc_identity + object_name, hash_name)
    if not hmac.compare_digest(expected, integrity):
        raise CredentialRefused(
            "credential blob integrity check failed: made for another EK or AK name, or tampered",
            TPM_RC_INTEGRITY,
        )
    sym_key = kdfa(hash_name, seed, b"STORAGE", object_name, b"", ek.sym_bits)
    decryptor = Cipher(algorithms.AES(sym_key), CFB(bytes(16))).decryptor()
    plain = decryptor.update(enc_identity) + decryptor.finalize()
    size = int.from_bytes(plain[:2], "big") if len(plain) >= 2 else -1
    if size < 0 or size != len(plain) - 2 or size > digest_size:
        raise CredentialRefused("decrypted credential is not one TPM2B_DIGEST", TPM_RC_SIZE)
    return plain[2:]
