"""A TPM in software for the join benchmark: the client side of thousands of joins on one core.

Each :class:`SoftTpm` holds an EK and an AK whose private keys live in this process, and produces
the same marshalled structures a TPM would: TPM2B_PUBLIC areas from the TCG EK template and from
the AK template of :mod:`bootstrap.node.tpm`, TPM2_ActivateCredential over the server's
TPM2B_ID_OBJECT / TPM2B_ENCRYPTED_SECRET, and TPM2_Quote output (TPMS_ATTEST + TPMT_SIGNATURE).
``tests/attest/test_softtpm.py`` pins the byte layouts against swtpm.

Such a TPM proves nothing, of course: the server admits it only because the benchmark allowlists
its EK (or certifies it with a software CA). The point is to measure the server, not the client.

    soft = SoftTpm.create()
    blob, enc = tpm.make_credential(soft.ek_public, soft.ak_name, secret)   # server side
    assert soft.activate_credential(blob, enc) == secret
    quote, signature, pcrs = soft.quote("sha256:0,1,2,3,4,5,6,7", qualifying_data)

The parts: the refusals and their response codes (``softtpm_errors``), ActivateCredential
(``softtpm_activate``), keys from a seed (``softtpm_keys``) and EK certificates (``softtpm_ekcert``);
this module is the TPM itself, its quotes and pools of TPMs, and what importers use.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
import time
from collections.abc import Mapping
from functools import lru_cache
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from attest import keys, wire
from attest.templates import POLICY_A_SHA256
from attest.tpm import TPM_RH_ENDORSEMENT, qualified_name
from attest.wire import TPM_GENERATED_VALUE, TPM_ST_ATTEST_QUOTE, Alg, tpm2b
from tests.support import softtpm_ekcert
from tests.support.fakes import AK_ATTRS, ecc_public, rsa_ek_public, sign_ecdsa
from tests.support.softtpm_activate import OAEP_IDENTITY, activate
from tests.support.softtpm_errors import (
    TPM_RC_ECC_POINT,
    TPM_RC_FAILURE,
    TPM_RC_INTEGRITY,
    TPM_RC_SIZE,
    TPM_RC_VALUE,
    ChallengeMalformed,
    CredentialRefused,
    QuoteRefused,
    SoftTpmError,
)
from tests.support.softtpm_keys import Drbg, E, ecc_from_drbg, rsa_from_primes, seeded_prime

__all__ = [
    "FIRMWARE_VERSION",
    "TPM_RC_ECC_POINT",
    "TPM_RC_FAILURE",
    "TPM_RC_INTEGRITY",
    "TPM_RC_SIZE",
    "TPM_RC_VALUE",
    "ChallengeMalformed",
    "CredentialRefused",
    "EkKind",
    "QuoteRefused",
    "SoftTpm",
    "SoftTpmError",
    "activate",
    "soft_pool",
]

EkKind = Literal["rsa", "ecc"]

# What libtpms 0.9 (swtpm) reports as TPM_PT_FIRMWARE_VERSION_1 || _2 in every quote.
FIRMWARE_VERSION = 0x2019102300163636

_LOW_EK_ATTRS = 0x000300B2  # fixedTPM|fixedParent|sensitiveDataOrigin|adminWithPolicy|restricted|decrypt
_AES128_CFB = struct.pack(">HHH", Alg.AES, 128, Alg.CFB)
_MAX_QUALIFYING = 64  # TPM2B_DATA holds at most a TPMT_HA; the verifier's parser allows 64
_CLOCK_START_MS = 1_000_000
_OAEP_IDENTITY = OAEP_IDENTITY  # test_softtpm encrypts with it to make a seed of the wrong size


# ------------------------------------------------------------------------------------------
# Quotes


@lru_cache(maxsize=64)
def _selection(text: str) -> tuple[wire.Selection, bytes, tuple[tuple[str, tuple[int, ...], int], ...]]:
    """Parsed selection, its TPML_PCR_SELECTION as a TPM echoes it (3 select bytes, like
    swtpm and tpm2-tss), and (bank, sorted indices, digest size) for the pcrDigest."""
    banks = wire.parse_selection_string(text)
    layout = tuple((wire.BANK_BY_ALG[alg], tuple(sorted(idx)), wire.DIGEST_SIZES[alg]) for alg, idx in banks)
    return banks, wire.marshal_selection(banks), layout


_ATTEST_HEAD = struct.pack(">IH", TPM_GENERATED_VALUE, TPM_ST_ATTEST_QUOTE)


class SoftTpm:
    """One software TPM: an RSA-2048 EK in the standard (TCG default, low-range RSA 2048) EK template,
    and an ECC P-256 AK with the attributes bootstrap.node.tpm creates (restricted|sign|fixedTPM|
    fixedParent|sensitiveDataOrigin|userWithAuth, ECDSA-SHA256), created as a primary in the
    endorsement hierarchy (so the quote's qualifiedSigner matches attest.tpm's default expectation).

    With ``ek_kind="ecc"`` the EK follows the low-range ECC P-256 template (L-2) instead.
    ``pcrs`` is the PCR state quoted when no values are passed (all zero, as on a fresh swtpm);
    ``reset_count`` and ``restart_count`` may be changed to act out reboots.
    """

    def __init__(
        self, ek_key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, ak_key: ec.EllipticCurvePrivateKey
    ) -> None:
        if isinstance(ek_key, rsa.RSAPrivateKey):
            if ek_key.key_size != 2048 or ek_key.public_key().public_numbers().e != E:
                raise ValueError("an RSA EK is RSA-2048 with exponent 65537")
            self.ek_kind: EkKind = "rsa"
            self.ek_public = rsa_ek_public(ek_key.public_key())
        else:
            if not isinstance(ek_key.curve, ec.SECP256R1):
                raise TypeError("an ECC EK is on P-256")
            self.ek_kind = "ecc"
            self.ek_public = ecc_public(
                ek_key.public_key(),
                attrs=_LOW_EK_ATTRS,
                scheme=Alg.NULL,
                sym=_AES128_CFB,
                policy=POLICY_A_SHA256,
            )
        if not isinstance(ak_key.curve, ec.SECP256R1):
            raise TypeError("the AK is on P-256")
        self.ek_key = ek_key
        self.ak_key = ak_key
        self.ek_sha256 = hashlib.sha256(keys.spki_der(ek_key.public_key())).hexdigest()
        self.ak_public = ecc_public(ak_key.public_key(), attrs=AK_ATTRS)
        ak_area = wire.parse_public(self.ak_public, "ak_public")
        self.ak_name = keys.object_name(ak_area)  # TPM2B_NAME buffer: what MakeCredential binds
        self.ak_qualified_name = qualified_name(TPM_RH_ENDORSEMENT.to_bytes(4, "big"), self.ak_name)
        self._signer_field = tpm2b(self.ak_qualified_name)
        self.pcrs: dict[str, dict[int, bytes]] = {"sha256": {i: bytes(32) for i in range(24)}}
        self.reset_count = 1
        self.restart_count = 0
        self.firmware_version = FIRMWARE_VERSION
        self._t0 = time.monotonic()
        self.clock = _CLOCK_START_MS  # last Clock reported; TPM Clock counts milliseconds

    @classmethod
    def create(cls, *, ek_kind: EkKind = "rsa", seed: int | None = None) -> SoftTpm:
        """A new soft TPM. With ``seed`` the keys are derived from it (like a TPM's primaries
        from its endorsement seed): the same seed gives the same EK and AK."""
        ek_key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
        if ek_kind not in ("rsa", "ecc"):
            raise ValueError(f"ek_kind must be 'rsa' or 'ecc', not {ek_kind!r}")
        if seed is None:
            if ek_kind == "rsa":
                ek_key = rsa.generate_private_key(public_exponent=E, key_size=2048)
            else:
                ek_key = ec.generate_private_key(ec.SECP256R1())
            return cls(ek_key, ec.generate_private_key(ec.SECP256R1()))
        if ek_kind == "rsa":
            drbg = Drbg(seed, b"EK-RSA2048")
            p = seeded_prime(drbg)
            q = seeded_prime(drbg)
            while q == p:  # pragma: no cover - 2^-1000
                q = seeded_prime(drbg)
            ek_key = rsa_from_primes(p, q)
        else:
            ek_key = ecc_from_drbg(Drbg(seed, b"EK-ECC256"))
        return cls(ek_key, ecc_from_drbg(Drbg(seed, b"AK-ECC256")))

    # -- ActivateCredential ------------------------------------------------------------

    def activate_credential(self, credential_blob: bytes, encrypted_secret: bytes) -> bytes:
        """TPM2_ActivateCredential(activateHandle=AK, keyHandle=EK): the secret MakeCredential
        sealed to this EK for this AK's name. Raises :class:`SoftTpmError` otherwise."""
        return activate(self.ek_key, self.ek_public, self.ak_name, credential_blob, encrypted_secret)

    # -- Quote -------------------------------------------------------------------------

    def _tick(self) -> int:
        """Clock only moves forward: milliseconds since creation, at least one per quote."""
        now = _CLOCK_START_MS + int((time.monotonic() - self._t0) * 1000)
        self.clock = max(now, self.clock + 1)
        return self.clock

    def quote(
        self, selection: str, qualifying_data: bytes, pcrs: Mapping[str, Mapping[int, bytes]] | None = None
    ) -> tuple[bytes, bytes, dict[str, dict[int, bytes]]]:
        """TPM2_Quote with the AK's scheme (ECDSA/SHA-256) over ``selection``: returns
        (TPMS_ATTEST, TPMT_SIGNATURE, the quoted PCR values). ``pcrs`` overrides the state in
        :attr:`pcrs` for this quote; it must hold a value of the bank's size for each selected PCR."""
        _banks, raw_selection, layout = _selection(selection)
        if type(qualifying_data) is not bytes or len(qualifying_data) > _MAX_QUALIFYING:
            raise QuoteRefused(f"qualifying data must be at most {_MAX_QUALIFYING} bytes", TPM_RC_SIZE)
        source = self.pcrs if pcrs is None else pcrs
        values: dict[str, dict[int, bytes]] = {}
        parts: list[bytes] = []
        for bank, order, size in layout:
            given = source.get(bank, {})
            chosen: dict[int, bytes] = {}
            for i in order:
                v = given.get(i, bytes(size) if pcrs is None else None)
                if type(v) is not bytes or len(v) != size:
                    raise QuoteRefused(f"no {size}-byte value for PCR {bank}:{i}", TPM_RC_VALUE)
                chosen[i] = v
                parts.append(v)
            values[bank] = chosen
        attest = b"".join(
            (
                _ATTEST_HEAD,
                self._signer_field,
                tpm2b(qualifying_data),
                struct.pack(
                    ">QIIBQ", self._tick(), self.reset_count, self.restart_count, 1, self.firmware_version
                ),
                raw_selection,
                tpm2b(hashlib.sha256(b"".join(parts)).digest()),  # the AK scheme's hash
            )
        )
        return attest, sign_ecdsa(self.ak_key, attest), values

    # -- EK certificate ----------------------------------------------------------------

    def ek_certificate(
        self, issuer_key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, issuer_cert: x509.Certificate
    ) -> bytes:
        """A DER EK certificate for this EK, shaped like the ones swtpm_setup's local CA issues
        (:func:`tests.support.softtpm_ekcert.ek_certificate`)."""
        return softtpm_ekcert.ek_certificate(self.ek_key.public_key(), issuer_key, issuer_cert)


# ------------------------------------------------------------------------------------------
# Pools


def soft_pool(n: int, *, ek_kind: EkKind = "rsa") -> list[SoftTpm]:
    """``n`` soft TPMs, each with its own EK and AK.

    RSA key generation dominates (about 80 ms a key), so RSA EKs are built from a shared pool of
    OpenSSL primes: m primes give m(m-1)/2 distinct moduli, each the product of a distinct pair,
    so a pool of 1000 costs 23 key generations. Every EK is a valid RSA-2048 key of its own
    (distinct modulus, SPKI hash and OAEP behaviour); they are not *independent*: anyone holding
    two pool EKs that share a prime can factor both with a GCD. That matters to nobody here (the
    benchmark holds every private key anyway, and the verifier never sees two moduli together),
    but use :meth:`SoftTpm.create` when independent keys are the point.
    """
    if type(n) is not int or n < 0:
        raise ValueError("n must be a non-negative int")
    if ek_kind not in ("rsa", "ecc"):
        raise ValueError(f"ek_kind must be 'rsa' or 'ecc', not {ek_kind!r}")
    if ek_kind == "ecc":
        return [
            SoftTpm(ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1()))
            for _ in range(n)
        ]
    m = 2
    while m * (m - 1) // 2 < n:
        m += 1
    primes: list[int] = []
    while len(primes) < m:
        nums = rsa.generate_private_key(public_exponent=E, key_size=2048).private_numbers()
        primes += [nums.p, nums.q]
    out: list[SoftTpm] = []
    for i, j in itertools.combinations(range(len(primes)), 2):
        if len(out) == n:
            break
        p, q = primes[i], primes[j]
        if (p * q).bit_length() != 2048:  # OpenSSL's primes make full-size products; be sure
            continue
        out.append(SoftTpm(rsa_from_primes(p, q), ec.generate_private_key(ec.SECP256R1())))
    while len(out) < n:  # only if some product was short, which OpenSSL's primes rule out
        out.append(SoftTpm.create(ek_kind="rsa"))
    return out
