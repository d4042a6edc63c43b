"""TPM2_MakeCredential in software, and the proof a node returns after ActivateCredential.

MakeCredential (TPM 2.0 Part 1, 24 "Credential Protection") encrypts a secret so that only a TPM
holding the EK's private key *and* an object with the given name can recover it:

  seed            RSA EK: random, RSA-OAEP(label "IDENTITY") to the EK
                  ECC EK: ECDH with an ephemeral key, KDFe(Z, "IDENTITY", ephemeral.x, ek.x)
  symKey          KDFa(nameAlg, seed, "STORAGE", name, "", EK symmetric key bits)
  encIdentity     AES-CFB(symKey, IV = 0, TPM2B_DIGEST(secret))
  hmacKey         KDFa(nameAlg, seed, "INTEGRITY", "", "", digest bits)
  outerHMAC       HMAC(hmacKey, encIdentity || name)
  credentialBlob  TPM2B_ID_OBJECT(TPM2B_DIGEST(outerHMAC) || encIdentity)
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

try:  # CFB moved to "decrepit" in cryptography 47; the TPM still mandates it here.
    from cryptography.hazmat.decrepit.ciphers.modes import CFB
except ImportError:  # pragma: no cover - older cryptography
    from cryptography.hazmat.primitives.ciphers.modes import CFB

from attest.errors import MalformedInput, ProofInvalid
from attest.keys import CRYPTO_HASHES, CURVE_BYTES, PublicKey, hashlib_name
from attest.wire import Alg, Public, tpm2b

_U32 = struct.Struct(">I")


def kdfa(hash_name: str, key: bytes, label: bytes, context_u: bytes, context_v: bytes, bits: int) -> bytes:
    """SP 800-108 counter-mode KDF with HMAC, as the TPM defines it (Part 1, 11.4.10.2)."""
    out = bytearray()
    counter = 0
    tail = label + b"\x00" + context_u + context_v + _U32.pack(bits)
    while len(out) * 8 < bits:
        counter += 1
        out += hmac.digest(key, _U32.pack(counter) + tail, hash_name)
    return bytes(out[: (bits + 7) // 8])


def kdfe(hash_name: str, z: bytes, label: bytes, party_u: bytes, party_v: bytes, bits: int) -> bytes:
    """SP 800-56A concatenation KDF, as the TPM defines it (Part 1, 11.4.10.3)."""
    out = bytearray()
    counter = 0
    tail = z + label + b"\x00" + party_u + party_v
    while len(out) * 8 < bits:
        counter += 1
        out += hashlib.new(hash_name, _U32.pack(counter) + tail).digest()
    return bytes(out[: (bits + 7) // 8])


def _seed(ek: Public, key: PublicKey, hash_name: str, digest_size: int) -> tuple[bytes, bytes]:
    """Return (seed, encrypted seed as the TPM2B_ENCRYPTED_SECRET payload)."""
    if isinstance(key, rsa.RSAPublicKey):
        seed = os.urandom(digest_size)
        algo = CRYPTO_HASHES[ek.name_alg]()
        enc = key.encrypt(
            seed, padding.OAEP(mgf=padding.MGF1(algorithm=algo), algorithm=algo, label=b"IDENTITY\x00")
        )
        return seed, enc
    size = CURVE_BYTES[ek.curve]
    ephemeral = ec.generate_private_key(key.curve)
    z = ephemeral.exchange(ec.ECDH(), key)
    numbers = ephemeral.public_key().public_numbers()
    ex, ey = numbers.x.to_bytes(size, "big"), numbers.y.to_bytes(size, "big")
    seed = kdfe(hash_name, z, b"IDENTITY", ex, ek.ecc_x, digest_size * 8)
    return seed, tpm2b(ex) + tpm2b(ey)


def make_credential(ek: Public, ek_key: PublicKey, name: bytes, secret: bytes) -> tuple[bytes, bytes]:
    """Return (TPM2B_ID_OBJECT, TPM2B_ENCRYPTED_SECRET), both marshalled with their size."""
    hash_name = hashlib_name(ek.name_alg)
    digest_size = hashlib.new(hash_name).digest_size
    if not 1 <= len(secret) <= digest_size:
        raise MalformedInput(f"credential secret must be 1..{digest_size} bytes")
    if ek.sym_alg != Alg.AES or ek.sym_mode != Alg.CFB:
        raise MalformedInput("EK symmetric algorithm is not AES-CFB")
    seed, encrypted_seed = _seed(ek, ek_key, hash_name, digest_size)
    sym_key = kdfa(hash_name, seed, b"STORAGE", name, b"", ek.sym_bits)
    encryptor = Cipher(algorithms.AES(sym_key), CFB(bytes(16))).encryptor()
    enc_identity = encryptor.update(tpm2b(secret)) + encryptor.finalize()
    hmac_key = kdfa(hash_name, seed, b"INTEGRITY", b"", b"", digest_size * 8)
    outer = hmac.digest(hmac_key, enc_identity + name, hash_name)
    return tpm2b(tpm2b(outer) + enc_identity), tpm2b(encrypted_seed)


def credential_proof(secret: bytes, session: str) -> bytes:
    """What the node returns after ActivateCredential: HMAC-SHA256(key=secret, msg=session)."""
    return hmac.digest(secret, session.encode("utf-8"), "sha256")


def verify_credential_proof(secret: bytes, session: str, proof: bytes) -> None:
    """Constant-time check of a node's proof; raises ProofInvalid."""
    if not hmac.compare_digest(credential_proof(secret, session), proof):
        raise ProofInvalid("credential proof does not match: the AK is not resident in the EK's TPM")
