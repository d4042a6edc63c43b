"""The attest benchmark's measured cases (``tests.bench.attest``): per quote and per EK a group of
cases doing the same job on the same input (ours warm and cold, keylime, tpm2-pytss, the floors),
each checked before it is timed, and the interleaved rounds that time them."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from attest import tpm, wire
from attest.keys import public_key
from tests.bench.attest_evidence import (
    FLOOR,
    FLOOR_COLD,
    KEYLIME,
    OURS,
    PYTSS,
    SELECTION,
    CredentialInput,
    QuoteEvidence,
    pytss_credential,
    tpm2_tools_pcr_blob,
)

# ------------------------------------------------------------------------------------------
# Cases


@dataclass
class Case:
    label: str
    impl: str  # OURS, KEYLIME, PYTSS, FLOOR or FLOOR_COLD
    fn: Callable[[], object]
    samples: list[float] = field(default_factory=list)  # ns per call, one per round

    @property
    def short(self) -> str:
        return self.label.split(" (")[0]


@dataclass
class Group:
    """Cases that do the same job on the same input; they are timed next to each other."""

    name: str
    calls: int  # calls per timed batch
    cases: list[Case]
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (label, why)

    def find(self, impl: str) -> Case | None:
        return next((c for c in self.cases if c.impl == impl), None)


def quote_group(kind: str, ev: QuoteEvidence, tpm_util: Any, calls: int) -> Group:
    ak = tpm.verify_ak(ev.ak_public)
    ak_public, quote, signature, pcrs, nonce = ev.ak_public, ev.quote, ev.signature, ev.pcrs, ev.nonce
    pem = ak.key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    blob = tpm2_tools_pcr_blob(pcrs)
    verify_quote, clear_caches, checkquote = tpm.verify_quote, tpm.clear_caches, tpm_util.checkquote

    def warm() -> object:
        return verify_quote(
            ak_public, quote, signature, selection=SELECTION, pcrs=pcrs, qualifying_data=nonce
        )

    def cold() -> object:
        clear_caches()
        return verify_quote(
            ak_public, quote, signature, selection=SELECTION, pcrs=pcrs, qualifying_data=nonce
        )

    def keylime() -> object:
        return checkquote(pem, nonce, signature, quote, blob, "sha256")

    sig = wire.parse_signature(signature)
    key = ak.key
    if isinstance(key, ec.EllipticCurvePublicKey):
        name, floor_label = "quote, ECC P-256 AK", "floor: ECDSA P-256 verify"
        der = encode_dss_signature(int.from_bytes(sig.r, "big"), int.from_bytes(sig.s, "big"))
        ecdsa, ec_verify = ec.ECDSA(hashes.SHA256()), key.verify

        def floor() -> object:
            return ec_verify(der, quote, ecdsa)

        curve, point = (
            key.curve,
            key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint),
        )
        from_point = ec.EllipticCurvePublicKey.from_encoded_point

        def floor_cold() -> object:
            return from_point(curve, point).verify(der, quote, ecdsa)

    else:
        name, floor_label = "quote, RSA-2048 AK", "floor: RSA PKCS1v15 verify"
        raw, pkcs1, sha256, rsa_verify = sig.sig, padding.PKCS1v15(), hashes.SHA256(), key.verify

        def floor() -> object:
            return rsa_verify(raw, quote, pkcs1, sha256)

        numbers = key.public_numbers()

        def floor_cold() -> object:
            return rsa.RSAPublicNumbers(numbers.e, numbers.n).public_key().verify(raw, quote, pkcs1, sha256)

    # Every case must accept this quote before it is timed.
    for check in (warm, cold):
        result = check()
        if not isinstance(result, tpm.QuoteResult) or result.pcrs != pcrs:
            raise RuntimeError(f"{name}: verify_quote returned {result!r}")
    if keylime() != {i: v.hex() for i, v in pcrs["sha256"].items()}:
        raise RuntimeError(f"{name}: keylime checkquote did not return the quoted PCRs")
    floor()
    return Group(
        name,
        calls,
        [
            Case("ours warm (AK cached)", OURS, warm),
            Case("ours cold (clear_caches + verify)", OURS, cold),
            Case("keylime checkquote", KEYLIME, keylime),
            Case(floor_label, FLOOR, floor),
            Case("floor cold: new key + verify", FLOOR_COLD, floor_cold),
        ],
    )


def credential_group(template: str, cred: CredentialInput, tpm_util: Any, calls: int) -> Group:
    ek_public, ak_name, secret = cred.ek_public, cred.ak_name, os.urandom(32)
    make, clear_caches, keylime_make = tpm.make_credential, tpm.clear_caches, tpm_util.makecredential

    def warm() -> object:
        return make(ek_public, ak_name, secret)

    def cold() -> object:
        clear_caches()
        return make(ek_public, ak_name, secret)

    def keylime() -> object:
        return keylime_make(ek_public, secret, ak_name)

    def pytss() -> object:
        return pytss_credential(ek_public, ak_name, secret)

    key = public_key(wire.parse_public(ek_public))
    if isinstance(key, rsa.RSAPublicKey):
        oaep = padding.OAEP(
            mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=b"IDENTITY\x00"
        )
        seed, encrypt = os.urandom(32), key.encrypt
        floor_label = "floor: RSA-OAEP encrypt 32 B"

        def floor() -> object:
            return encrypt(seed, oaep)

        numbers = key.public_numbers()

        def floor_cold() -> object:
            return rsa.RSAPublicNumbers(numbers.e, numbers.n).public_key().encrypt(seed, oaep)

    else:
        curve, ecdh, generate = key.curve, ec.ECDH(), ec.generate_private_key
        floor_label = f"floor: ECDH keygen + exchange {curve.name}"

        def floor() -> object:
            return generate(curve).exchange(ecdh, key)

        point = key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
        from_point = ec.EllipticCurvePublicKey.from_encoded_point

        def floor_cold() -> object:
            return generate(curve).exchange(ecdh, from_point(curve, point))

    group = Group(
        f"make_credential, {template} EK",
        calls,
        [Case("ours warm (EK cached)", OURS, warm), Case("ours cold (clear_caches + make)", OURS, cold)],
    )
    for impl, label, fn in (
        (KEYLIME, "keylime makecredential", keylime),
        (PYTSS, "tpm2-pytss make_credential", pytss),
    ):
        if impl in cred.broken:
            group.skipped.append((label, cred.broken[impl]))
        else:
            group.cases.append(Case(label, impl, fn))
    group.cases.append(Case(floor_label, FLOOR, floor))
    group.cases.append(Case("floor cold: new key + the same", FLOOR_COLD, floor_cold))
    for case in group.cases:
        case.fn()
    return group


# ------------------------------------------------------------------------------------------
# Timing


def _batch(fn: Callable[[], object], calls: int) -> float:
    """Per-call time in ns of ``calls`` back-to-back calls, the garbage collector paused."""
    fn()  # untimed: restores whatever state the case before disturbed (the parsed-key cache)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter_ns() - start
    finally:
        if gc_was_enabled:
            gc.enable()
    return elapsed / calls


def measure(groups: list[Group], rounds: int) -> None:
    """One warm-up batch per case, then ``rounds`` rounds; in each, every group runs each of its
    cases once, starting from a different case each round."""
    for group in groups:
        for case in group.cases:
            _batch(case.fn, group.calls)
    for r in range(rounds):
        for group in groups:
            shift = r % len(group.cases)
            for case in group.cases[shift:] + group.cases[:shift]:
                case.samples.append(_batch(case.fn, group.calls))
