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
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import math
import struct
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import ClassVar, Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.x509.oid import NameOID, ObjectIdentifier

try:  # CFB moved to "decrepit" in cryptography 47; the TPM still mandates it here.
    from cryptography.hazmat.decrepit.ciphers.modes import CFB
except ImportError:  # pragma: no cover - older cryptography
    from cryptography.hazmat.primitives.ciphers.modes import CFB

from attest import keys, wire
from attest.credential import kdfa, kdfe
from attest.templates import POLICY_A_SHA256
from attest.tpm import TPM_RH_ENDORSEMENT, qualified_name
from attest.wire import TPM_GENERATED_VALUE, TPM_ST_ATTEST_QUOTE, Alg, Public, tpm2b
from tests.support.fakes import AK_ATTRS, ecc_public, rsa_ek_public, sign_ecdsa

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

# TPM 2.0 response codes (Part 2, 6.6.3), format 1 ones without parameter number and P bit: what
# swtpm answers, so tests can compare a refusal with the real TPM's.
TPM_RC_FAILURE = 0x101  # format 0
TPM_RC_VALUE = 0x084
TPM_RC_SIZE = 0x095
TPM_RC_INTEGRITY = 0x09F
TPM_RC_ECC_POINT = 0x0A7

_LOW_EK_ATTRS = 0x000300B2  # fixedTPM|fixedParent|sensitiveDataOrigin|adminWithPolicy|restricted|decrypt
_AES128_CFB = struct.pack(">HHH", Alg.AES, 128, Alg.CFB)
_OAEP_IDENTITY = padding.OAEP(
    mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(), label=b"IDENTITY\x00"
)
# sizeof(TPMS_ID_OBJECT) and sizeof(TPMU_ENCRYPTED_SECRET) for SHA-256 / RSA-2048 / P-256 TPMs.
_MAX_ID_OBJECT = 2 + 64 + 2 + 64
_MAX_ENCRYPTED_SECRET = 512
_MAX_QUALIFYING = 64  # TPM2B_DATA holds at most a TPMT_HA; the verifier's parser allows 64
_CLOCK_START_MS = 1_000_000


class SoftTpmError(Exception):
    """A soft TPM refused a command. ``rc`` is the response code a real TPM would give."""

    code: ClassVar[str] = "soft_tpm_error"

    def __init__(self, detail: str, rc: int) -> None:
        super().__init__(detail)
        self.detail = detail
        self.rc = rc


class ChallengeMalformed(SoftTpmError):
    """The credential blob or encrypted secret does not unmarshal (a TSS would refuse to send it)."""

    code = "challenge_malformed"


class CredentialRefused(SoftTpmError):
    """ActivateCredential failed: not for this EK, not for this AK name, or tampered."""

    code = "credential_refused"


class QuoteRefused(SoftTpmError):
    """A quote request the TPM would refuse (oversized qualifying data, wrong PCR values given)."""

    code = "quote_refused"


# ------------------------------------------------------------------------------------------
# ActivateCredential


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
            seed = ek_key.decrypt(payload, _OAEP_IDENTITY)
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


# ------------------------------------------------------------------------------------------
# Deterministic keys (``seed=``), and RSA keys from given primes


class _Drbg:
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
_E = 65537


def _probable_prime(n: int, drbg: _Drbg, rounds: int) -> bool:
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


def _seeded_prime(drbg: _Drbg, bits: int = 1024) -> int:
    """A prime with its top two bits set (so two of them make a full-size modulus) and p-1
    coprime to 65537. Only for ``seed=``: OpenSSL cannot take a seed and is much faster."""
    while True:
        c = int.from_bytes(drbg.read(bits // 8), "big") | (3 << (bits - 2)) | 1
        if math.gcd(c, _SMALL_PRODUCT) != 1 or c % _E == 1:
            continue
        if _probable_prime(c, drbg, rounds=5):
            return c


def _rsa_from_primes(p: int, q: int) -> rsa.RSAPrivateKey:
    d = pow(_E, -1, math.lcm(p - 1, q - 1))
    numbers = rsa.RSAPrivateNumbers(
        p, q, d, d % (p - 1), d % (q - 1), pow(q, -1, p), rsa.RSAPublicNumbers(_E, p * q)
    )
    # The primes come from OpenSSL or from _seeded_prime; re-proving them would cost more than
    # generating them.
    return numbers.private_key(unsafe_skip_rsa_key_validation=True)


def _ecc_from_drbg(drbg: _Drbg) -> ec.EllipticCurvePrivateKey:
    order = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # P-256 group order
    return ec.derive_private_key(int.from_bytes(drbg.read(40), "big") % (order - 1) + 1, ec.SECP256R1())


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
            if ek_key.key_size != 2048 or ek_key.public_key().public_numbers().e != _E:
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
                ek_key = rsa.generate_private_key(public_exponent=_E, key_size=2048)
            else:
                ek_key = ec.generate_private_key(ec.SECP256R1())
            return cls(ek_key, ec.generate_private_key(ec.SECP256R1()))
        if ek_kind == "rsa":
            drbg = _Drbg(seed, b"EK-RSA2048")
            p = _seeded_prime(drbg)
            q = _seeded_prime(drbg)
            while q == p:  # pragma: no cover - 2^-1000
                q = _seeded_prime(drbg)
            ek_key = _rsa_from_primes(p, q)
        else:
            ek_key = _ecc_from_drbg(_Drbg(seed, b"EK-ECC256"))
        return cls(ek_key, _ecc_from_drbg(_Drbg(seed, b"AK-ECC256")))

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
        """A DER EK certificate for this EK, shaped like the ones swtpm_setup's local CA issues:
        subject CN=unknown, validity until 9999-12-31, extensions (in swtpm's order) EKU
        tcg-kp-EKCertificate, critical SAN directoryName with TPM manufacturer/model/version,
        critical basicConstraints CA:FALSE, subjectDirectoryAttributes with the TPM spec version,
        the issuer's key identifier, and critical keyUsage keyEncipherment (RSA) or keyAgreement (ECC)."""
        ek_key = self.ek_key.public_key()
        tcg = "2.23.133.2."
        san = x509.Name(
            [
                x509.NameAttribute(ObjectIdentifier(tcg + "1"), "id:00001014"),  # tpmManufacturer
                x509.NameAttribute(ObjectIdentifier(tcg + "2"), "swtpm"),  # tpmModel
                x509.NameAttribute(ObjectIdentifier(tcg + "3"), "id:20191023"),  # tpmVersion
            ]
        )
        # SEQUENCE { SEQUENCE { tcg-at-tpmSpecification, SET { SEQUENCE { "2.0", 0, 164 } } } }
        spec = bytes.fromhex("3019301706056781050210310e300c0c03322e30020100020200a4")
        rsa_ek = isinstance(ek_key, rsa.RSAPublicKey)
        now = datetime.now(UTC).replace(microsecond=0)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "unknown")]))
            .issuer_name(issuer_cert.subject)
            .public_key(ek_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=1))
            .not_valid_after(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC))
            .add_extension(x509.ExtendedKeyUsage([ObjectIdentifier("2.23.133.8.1")]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DirectoryName(san)]), critical=True)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.UnrecognizedExtension(ObjectIdentifier("2.5.29.9"), spec), critical=False)
            .add_extension(_authority_key_id(issuer_cert), critical=False)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=rsa_ek,
                    data_encipherment=False,
                    key_agreement=not rsa_ek,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
        )
        return builder.sign(issuer_key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


def _authority_key_id(issuer_cert: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    try:
        ski = issuer_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_cert.public_key())  # type: ignore[arg-type]
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


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
        nums = rsa.generate_private_key(public_exponent=_E, key_size=2048).private_numbers()
        primes += [nums.p, nums.q]
    out: list[SoftTpm] = []
    for i, j in itertools.combinations(range(len(primes)), 2):
        if len(out) == n:
            break
        p, q = primes[i], primes[j]
        if (p * q).bit_length() != 2048:  # OpenSSL's primes make full-size products; be sure
            continue
        out.append(SoftTpm(_rsa_from_primes(p, q), ec.generate_private_key(ec.SECP256R1())))
    while len(out) < n:  # only if some product was short, which OpenSSL's primes rule out
        out.append(SoftTpm.create(ek_kind="rsa"))
    return out
