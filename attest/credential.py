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
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

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
    tail = label + b"\x00" + context_u + context_v + _U32.pack(bits)
    out = hmac.digest(key, b"\x00\x00\x00\x01" + tail, hash_name)
    counter = 1
    while len(out) * 8 < bits:
        counter += 1
        out += hmac.digest(key, _U32.pack(counter) + tail, hash_name)
    return out[: (bits + 7) // 8]


def kdfe(hash_name: str, z: bytes, label: bytes, party_u: bytes, party_v: bytes, bits: int) -> bytes:
    """SP 800-56A concatenation KDF, as the TPM defines it (Part 1, 11.4.10.3)."""
    out = b""
    counter = 0
    tail = z + label + b"\x00" + party_u + party_v
    while len(out) * 8 < bits:
        counter += 1
        out += hashlib.new(hash_name, _U32.pack(counter) + tail).digest()
    return out[: (bits + 7) // 8]


class EkSealer:
    """MakeCredential to one EK, with its per-key constants computed once."""

    __slots__ = ("_digest_size", "_ek", "_hash", "_key", "_oaep")

    def __init__(self, ek: Public, key: PublicKey) -> None:
        if ek.sym_alg != Alg.AES or ek.sym_mode != Alg.CFB:
            raise MalformedInput("EK symmetric algorithm is not AES-CFB")
        self._ek = ek
        self._key = key
        self._hash = hashlib_name(ek.name_alg)
        self._digest_size = hashlib.new(self._hash).digest_size
        algo = CRYPTO_HASHES[ek.name_alg]()
        self._oaep = padding.OAEP(mgf=padding.MGF1(algorithm=algo), algorithm=algo, label=b"IDENTITY\x00")

    def _seed(self) -> tuple[bytes, bytes]:
        """Return (seed, encrypted seed as the TPM2B_ENCRYPTED_SECRET payload)."""
        key = self._key
        if isinstance(key, rsa.RSAPublicKey):
            seed = os.urandom(self._digest_size)
            return seed, key.encrypt(seed, self._oaep)
        ephemeral = ec.generate_private_key(key.curve)
        z = ephemeral.exchange(ec.ECDH(), key)
        point = ephemeral.public_key().public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
        size = CURVE_BYTES[self._ek.curve]
        ex, ey = point[1 : 1 + size], point[1 + size :]
        seed = kdfe(self._hash, z, b"IDENTITY", ex, self._ek.ecc_x, self._digest_size * 8)
        return seed, tpm2b(ex) + tpm2b(ey)

    def make(self, name: bytes, secret: bytes) -> tuple[bytes, bytes]:
        """Return (TPM2B_ID_OBJECT, TPM2B_ENCRYPTED_SECRET), both marshalled with their size."""
        if not 1 <= len(secret) <= self._digest_size:
            raise MalformedInput(f"credential secret must be 1..{self._digest_size} bytes")
        seed, encrypted_seed = self._seed()
        sym_key = kdfa(self._hash, seed, b"STORAGE", name, b"", self._ek.sym_bits)
        encryptor = Cipher(algorithms.AES(sym_key), CFB(bytes(16))).encryptor()
        enc_identity = encryptor.update(tpm2b(secret)) + encryptor.finalize()
        hmac_key = kdfa(self._hash, seed, b"INTEGRITY", b"", b"", self._digest_size * 8)
        outer = hmac.digest(hmac_key, enc_identity + name, self._hash)
        return tpm2b(tpm2b(outer) + enc_identity), tpm2b(encrypted_seed)


def make_credential(ek: Public, ek_key: PublicKey, name: bytes, secret: bytes) -> tuple[bytes, bytes]:
    """Return (TPM2B_ID_OBJECT, TPM2B_ENCRYPTED_SECRET), both marshalled with their size."""
    return EkSealer(ek, ek_key).make(name, secret)


def credential_proof(secret: bytes, session: str) -> bytes:
    """What the node returns after ActivateCredential: HMAC-SHA256(key=secret, msg=session)."""
    if type(secret) is not bytes or type(session) is not str:
        raise MalformedInput("credential proof needs a bytes secret and a str session")
    return hmac.digest(secret, session.encode("utf-8"), "sha256")


def verify_credential_proof(secret: bytes, session: str, proof: bytes) -> None:
    """Constant-time check of a node's proof; raises ProofInvalid."""
    if type(proof) is not bytes:
        raise MalformedInput("credential proof must be bytes")
    if not hmac.compare_digest(credential_proof(secret, session), proof):
        raise ProofInvalid("credential proof does not match: the AK is not resident in the EK's TPM")
