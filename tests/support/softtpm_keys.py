"""The soft TPM's private keys from a seed (``tests.support.softtpm``): a SHA-256 DRBG, RSA-2048
primes and keys built from given primes, and P-256 keys, so that one seed gives the same EK and AK."""

from __future__ import annotations

import hashlib
import math

from cryptography.hazmat.primitives.asymmetric import ec, rsa


class Drbg:
    """SHA-256 in counter mode over a seed and a label: reproducible key material for tests."""

    def __init__(self, seed: int, label: bytes) -> None:
        if type(seed) is not int or seed < 0:
            raise ValueError("seed must be a non-negative int")
        self._key = hashlib.sha256(b"nodegate softtpm\x00" + label + b"\x00" + str(seed).encode()).digest()
        self._counter = 0

    def read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            self._counter += 1
            out += hashlib.sha256(self._key + self._counter.to_bytes(8, "big")).digest()
        return out[:n]


_SMALL_PRIMES = [p for p in range(3, 2000, 2) if all(p % d for d in range(3, math.isqrt(p) + 1, 2))]
_SMALL_PRODUCT = math.prod(_SMALL_PRIMES)
E = 65537


def _probable_prime(n: int, drbg: Drbg, rounds: int) -> bool:
    """Miller-Rabin with base 2 first (cheap rejection), then ``rounds`` random bases."""
    d, s = n - 1, 0
    while not d & 1:
        d >>= 1
        s += 1
    bases = [2] + [2 + int.from_bytes(drbg.read(128), "big") % (n - 3) for _ in range(rounds)]
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def seeded_prime(drbg: Drbg, bits: int = 1024) -> int:
    """A prime with its top two bits set (so two of them make a full-size modulus) and p-1
    coprime to 65537. Only for ``seed=``: OpenSSL cannot take a seed and is much faster."""
    while True:
        c = int.from_bytes(drbg.read(bits // 8), "big") | (3 << (bits - 2)) | 1
        if math.gcd(c, _SMALL_PRODUCT) != 1 or c % E == 1:
            continue
        if _probable_prime(c, drbg, rounds=5):
            return c


def rsa_from_primes(p: int, q: int) -> rsa.RSAPrivateKey:
    d = pow(E, -1, math.lcm(p - 1, q - 1))
    numbers = rsa.RSAPrivateNumbers(
        p, q, d, d % (p - 1), d % (q - 1), pow(q, -1, p), rsa.RSAPublicNumbers(E, p * q)
    )
    # The primes come from OpenSSL or from seeded_prime; re-proving them would cost more than
    # generating them.
    return numbers.private_key(unsafe_skip_rsa_key_validation=True)


def ecc_from_drbg(drbg: Drbg) -> ec.EllipticCurvePrivateKey:
    order = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # P-256 group order
    return ec.derive_private_key(int.from_bytes(drbg.read(40), "big") % (order - 1) + 1, ec.SECP256R1())
