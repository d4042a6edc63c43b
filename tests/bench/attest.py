"""Benchmark of the TPM attestation core (``attest.tpm``) against keylime, tpm2-pytss and a floor.

What is measured, all in one run on evidence from one software TPM (swtpm): an RSA-2048 and an
ECC P-384 EK, an ECC P-256 and an RSA-2048 AK, one TPM2_Quote per AK over sha256:0-7.

Quote verification, per AK:
  ours warm   ``tpm.verify_quote`` with the AK already in the parsed-key cache (a repeat caller)
  ours cold   ``tpm.clear_caches()`` + ``tpm.verify_quote``: the AK is parsed, checked and turned
              into a key object on every call (a node seen for the first time)
  keylime     ``keylime.tpm.tpm_util.checkquote`` on the same quote; it takes the AK as PEM (made
              once, outside the timing) and the PCRs as a tpm2-tools PCR blob (also made once),
              and loads the PEM on every call, so it is comparable to "ours cold"
  floor       one bare ``cryptography`` signature check of the quote bytes with a pre-loaded key
              and pre-built signature/algorithm objects: what any verifier must at least spend
  floor cold  the key object built from the AK's public numbers, then that check: what any
              verifier must spend on an AK it has never seen (OpenSSL's first use of a new key
              object costs extra); "ours cold" is held against this floor

MakeCredential, per EK (bytes in, bytes out; each result is first checked by ActivateCredential
on the swtpm, so only outputs that really work are timed):
  ours warm   ``tpm.make_credential`` with the EK already in the parsed-key cache
  ours cold   ``tpm.clear_caches()`` + ``tpm.make_credential``
  keylime     ``tpm_util.makecredential`` (parses the EK every call; tpm2-tools output format)
  tpm2-pytss  ``TPM2B_PUBLIC.unmarshal`` + ``tpm2_pytss.utils.make_credential`` + ``marshal``
  floor       RSA EK: one RSA-OAEP(SHA-256, label "IDENTITY") encryption of 32 bytes;
              ECC EK: one ephemeral key generation + ECDH exchange on the EK's curve
  floor cold  the same with the EK key object built first

Method: the cases of one group (same job, same input) are timed next to each other. After one
warm-up batch per case come R rounds; in each round every group runs each of its cases once,
starting from a different case each round, as one untimed call (it refills the cache a "cold"
neighbour emptied) plus a batch of N timed calls (``time.perf_counter_ns``, garbage collector
paused). Each round gives one per-call time per case.

How to read the table:
  µs/op         median per-call time over rounds; p90 beside it shows the spread
  vs keylime    throughput case / keylime (= keylime time / case time); > 1 is faster
  vs floor      time case / floor; 1.00x would mean nothing is spent beyond the crypto itself
Both ratios are medians of per-round ratios, not ratios of the medians: on a shared or
frequency-scaling machine the absolute times drift by tens of percent between rounds, while the
cases measured side by side in one round drift together. Trust the ratios over the µs.
The targets at the end are reported, never asserted; the exit code is 0 unless something crashes.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib
import json
import logging
import os
import platform
import statistics
import struct
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TSS2_LOG", "all+none")  # before tpm2_pytss loads libtss2

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from attest import tpm, wire
from attest.keys import public_key
from tests.bench import common

SELECTION = "sha256:0,1,2,3,4,5,6,7"
QUOTE_CALLS = 200  # per timed batch; a batch takes 10-60 ms
CREDENTIAL_CALLS = 100
ECC_CREDENTIAL_CALLS = 25  # each call is ~1 ms (P-384 keygen + ECDH), so fewer keep batches short
ROUNDS = 25

OURS, KEYLIME, PYTSS, FLOOR, FLOOR_COLD = "ours", "keylime", "tpm2-pytss", "floor", "floor-cold"


# ------------------------------------------------------------------------------------------
# Evidence from one swtpm


@dataclass(frozen=True)
class QuoteEvidence:
    ak_public: bytes
    quote: bytes
    signature: bytes
    pcrs: dict[str, dict[int, bytes]]
    nonce: bytes


@dataclass(frozen=True)
class CredentialInput:
    ek_public: bytes
    ak_name: bytes  # the AK that was loaded beside this EK when the outputs were activated
    broken: dict[str, str]  # implementation -> why it is skipped (raised, or did not activate)


@dataclass(frozen=True)
class Evidence:
    quotes: dict[str, QuoteEvidence]  # AK kind "ecc" / "rsa"
    credentials: dict[str, CredentialInput]  # EK kind "rsa" / "ecc"
    ek_templates: dict[str, str]


def _quiet_keylime() -> Any:
    """Import keylime's tpm_util without its missing-config warning and deprecation noise."""
    logging.getLogger("keylime").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"keylime(\.|$)")
    warnings.filterwarnings("ignore", module=r"tpm2_pytss(\.|$)")
    tpm_util = importlib.import_module("keylime.tpm.tpm_util")  # untyped; used through Any
    logging.getLogger("keylime").setLevel(logging.ERROR)
    return tpm_util


def _keylime_credential(
    tpm_util: Any, ek_public: bytes, ak_name: bytes, secret: bytes
) -> tuple[bytes, bytes]:
    """keylime's makecredential; its tpm2-tools output split into the two TPM2B structures."""
    out = tpm_util.makecredential(ek_public, secret, ak_name)
    if out[:8] != struct.pack(">II", 0xBADCC0DE, 1):
        raise ValueError("keylime makecredential output lacks the tpm2-tools header")
    (size,) = struct.unpack_from(">H", out, 8)
    return out[8 : 10 + size], out[10 + size :]


def _pytss_credential(ek_public: bytes, ak_name: bytes, secret: bytes) -> tuple[bytes, bytes]:
    from tpm2_pytss import TPM2B_PUBLIC
    from tpm2_pytss.utils import make_credential

    blob, enc = make_credential(TPM2B_PUBLIC.unmarshal(ek_public)[0], secret, ak_name)
    return blob.marshal(), enc.marshal()


def _credential_impls(tpm_util: Any) -> dict[str, Callable[[bytes, bytes, bytes], tuple[bytes, bytes]]]:
    return {
        OURS: tpm.make_credential,
        KEYLIME: lambda ek, name, secret: _keylime_credential(tpm_util, ek, name, secret),
        PYTSS: _pytss_credential,
    }


def _check_credentials(node: Any, ek: Any, ak: Any, tpm_util: Any) -> tuple[bytes, dict[str, str]]:
    """Activate each implementation's credential on the TPM; return the AK name and what failed."""
    from tpm2_pytss import TPM2B_PUBLIC

    ak_name = tpm.verify_ak(ak.public).name
    if bytes(TPM2B_PUBLIC.unmarshal(ak.public)[0].get_name()) != ak_name:
        raise RuntimeError("tpm2-pytss and attest.tpm disagree on the AK name")
    broken: dict[str, str] = {}
    for impl, make in _credential_impls(tpm_util).items():
        secret = os.urandom(32)
        try:
            blob, enc = make(ek.public, ak_name, secret)
        except Exception as exc:  # noqa: BLE001  any failure of a third-party implementation is a skip
            broken[impl] = f"raised {type(exc).__name__}: {exc}"
            continue
        try:
            recovered = node.activate_credential(ak, ek, blob, enc)
            why = "" if recovered == secret else "output activated to a different secret"
        except Exception as exc:  # noqa: BLE001
            why = f"output did not activate ({exc})"
        if why and impl == OURS:
            raise RuntimeError(f"attest.tpm.make_credential is wrong for the {ek.template} EK: {why}")
        if why:
            broken[impl] = why
    return ak_name, broken


def collect_evidence(workdir: Path, tpm_util: Any) -> Evidence:
    """Manufacture one swtpm and take the EKs, AKs, quotes and checked credentials from it."""
    from bootstrap.demo import swtpm
    from bootstrap.node.tpm import Agent, AkKind, EkKind

    pairs: tuple[tuple[EkKind, AkKind], ...] = (("rsa", "ecc"), ("ecc", "rsa"))
    ca = swtpm.make_ca(workdir / "xdg")
    swtpm.manufacture(ca, workdir / "tpm")
    server = swtpm.start(ca, workdir / "tpm")
    quotes: dict[str, QuoteEvidence] = {}
    credentials: dict[str, CredentialInput] = {}
    templates: dict[str, str] = {}
    try:
        with Agent(server.tcti) as node:  # distinct PCR values, so a wrongly ordered blob shows
            for i in range(8):
                node.extend_pcr(i, hashlib.sha256(b"nodegate bench PCR %d" % i).digest())
        # swtpm has three transient object slots: one EK and one AK per session.
        for ek_kind, ak_kind in pairs:
            with Agent(server.tcti) as node:
                ek = node.create_ek(ek_kind)
                ak = node.create_ak(ak_kind)
                nonce = os.urandom(32)
                quote, signature = node.quote(ak, SELECTION, nonce)
                pcrs = node.read_pcrs(SELECTION)
                quotes[ak_kind] = QuoteEvidence(ak.public, quote, signature, pcrs, nonce)
                ak_name, broken = _check_credentials(node, ek, ak, tpm_util)
                credentials[ek_kind] = CredentialInput(ek.public, ak_name, broken)
                templates[ek_kind] = ek.template
    finally:
        server.stop()
    return Evidence(quotes, credentials, templates)


def tpm2_tools_pcr_blob(pcrs: dict[str, dict[int, bytes]]) -> bytes:
    """The in-memory (little-endian, unmarshalled) blob tpm2-tools writes for a PCR read, which
    keylime's checkquote takes: TPML_PCR_SELECTION with 16 fixed entries, then TPML_DIGESTs of
    8 fixed TPM2B_DIGEST slots each. keylime reads one bank only."""
    if len(pcrs) != 1:
        raise ValueError("keylime's PCR blob parser handles exactly one bank")
    ((bank, values),) = pcrs.items()
    mask = 0
    for i in values:
        mask |= 1 << i
    out = bytearray(struct.pack("<I", 1))
    out += struct.pack("<HB", wire.BANK_NAMES[bank], 3) + mask.to_bytes(3, "little") + bytes(2)
    out += bytes(8 * 15)  # the 15 unused TPMS_PCR_SELECTION slots
    ordered = [values[i] for i in sorted(values)]
    groups = [ordered[i : i + 8] for i in range(0, len(ordered), 8)]
    out += struct.pack("<I", len(groups))
    for group in groups:
        out += struct.pack("<I", len(group))
        for slot in range(8):
            digest = group[slot] if slot < len(group) else b""
            out += struct.pack("<H", len(digest)) + digest.ljust(64, b"\x00")
    return bytes(out)


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


def _quote_group(kind: str, ev: QuoteEvidence, tpm_util: Any, calls: int) -> Group:
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


def _credential_group(template: str, cred: CredentialInput, tpm_util: Any, calls: int) -> Group:
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
        return _pytss_credential(ek_public, ak_name, secret)

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


# ------------------------------------------------------------------------------------------
# Results


def _p90(values: list[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def _median_ratio(top: list[float], bottom: list[float]) -> float:
    """Median over rounds of top/bottom: the machine's speed in a round cancels out."""
    return statistics.median(t / b for t, b in zip(top, bottom, strict=True))


def summarise(groups: list[Group], config: dict[str, Any]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    for group in groups:
        keylime, floor, floor_cold = group.find(KEYLIME), group.find(FLOOR), group.find(FLOOR_COLD)
        for case in group.cases:
            median = statistics.median(case.samples)
            vs_keylime = _median_ratio(keylime.samples, case.samples) if keylime else None
            # A cold case (key never seen) is held against the cold floor: building the key
            # object and its first use cost OpenSSL the same whoever calls it.
            base = floor_cold if ("cold" in case.label and case.impl == OURS and floor_cold) else floor
            vs_floor = _median_ratio(case.samples, base.samples) if base else None
            rows.append(
                {
                    "group": group.name,
                    "case": case.label,
                    "impl": case.impl,
                    "calls_per_round": group.calls,
                    "rounds": len(case.samples),
                    "median_us": median / 1000,
                    "p90_us": _p90(case.samples) / 1000,
                    "min_us": min(case.samples) / 1000,
                    "ops_per_s": 1e9 / median,
                    "vs_keylime": vs_keylime,
                    "vs_floor": vs_floor,
                    "samples_us": [round(x / 1000, 3) for x in case.samples],
                }
            )
            if case.impl != OURS:
                continue
            need = 1.5 if group.name.startswith("quote") else 1.0
            if vs_keylime is not None:
                targets.append(
                    _target(group.name, case.short, "vs keylime throughput", vs_keylime, ">=", need)
                )
            else:
                note = "; ".join(why for label, why in group.skipped if label.startswith("keylime"))
                targets.append(
                    _target(group.name, case.short, "vs keylime throughput", None, ">=", need, note)
                )
            if vs_floor is not None:
                metric = "time vs cold floor" if base is floor_cold else "time vs floor"
                targets.append(_target(group.name, case.short, metric, vs_floor, "<=", 1.3))
    return {
        "benchmark": "attest",
        "environment": _environment(),
        "config": config,
        "cases": rows,
        "skipped": [
            {"group": g.name, "case": label, "note": why} for g in groups for label, why in g.skipped
        ],
        "targets": targets,
    }


def _target(
    group: str, case: str, metric: str, value: float | None, op: str, threshold: float, note: str = ""
) -> dict[str, Any]:
    met = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
    out = {"group": group, "case": case, "metric": metric, "value": value, "op": op, "threshold": threshold}
    return {**out, "met": met, **({"note": note} if note else {})}


def _environment() -> dict[str, Any]:
    from cryptography.hazmat.backends.openssl.backend import backend

    versions = common.versions(("cryptography", "keylime", "tpm2-pytss", "nodegate"))
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "openssl": backend.openssl_version_text(),
        "versions": versions,
    }


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def render(results: dict[str, Any]) -> str:
    env, config = results["environment"], results["config"]
    lines = [
        "attest benchmark: TPM quote verification and MakeCredential",
        f"  Python {env['python']} ({env['implementation']}, {env['machine']}, {env['cpus']} CPUs), "
        f"{env['openssl']}",
        "  " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
        f"  {config['rounds']} rounds, cases interleaved within each group (calls per batch in brackets)",
        f"  µs/op and p90: median and 90th percentile over rounds; timed part {config['timed_seconds']} s",
        "  vs keylime: throughput case/keylime (higher is better); vs floor: time case/floor;",
        "  both ratios are medians of per-round ratios",
        "",
    ]
    header = f"  {'case':<40} {'µs/op':>9} {'p90':>9} {'ops/s':>9} {'vs keylime':>11} {'vs floor':>9}"
    groups = dict.fromkeys(row["group"] for row in results["cases"])
    for group in groups:
        lines += [f"{group} [{results['config']['calls'][group]}]", header]
        for row in results["cases"]:
            if row["group"] == group:
                lines.append(
                    f"  {row['case']:<40} {row['median_us']:>9.1f} {row['p90_us']:>9.1f} "
                    f"{row['ops_per_s']:>9,.0f} {_ratio(row['vs_keylime']):>11} {_ratio(row['vs_floor']):>9}"
                )
        for skip in results["skipped"]:
            if skip["group"] == group:
                lines.append(f"  {skip['case']:<40} skipped: {skip['note']}")
        lines.append("")
    lines.append("targets (reported, not asserted)")
    for t in results["targets"]:
        goal = f"{t['op']} {t['threshold']:.2f}x"
        head = f"{t['group']:<36} {t['case']:<10} {t['metric']:<22}"
        if t["met"] is None:
            lines.append(f"  n/a   {head} {'-':>7}  {goal}  ({t.get('note', '')})")
        else:
            lines.append(f"  {'met ' if t['met'] else 'MISS'}  {head} {t['value']:>6.2f}x  {goal}")
    judged = [t for t in results["targets"] if t["met"] is not None]
    lines.append(f"  {sum(1 for t in judged if t['met'])} of {len(judged)} targets met")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# Entry point


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print the results as one JSON object on one line")
    p.add_argument("--rounds", type=common.positive, default=ROUNDS, help=f"timed rounds (default {ROUNDS})")
    p.add_argument("--quick", action="store_true", help="a smoke run: 3 rounds of a tenth of the calls")
    return p


def run(rounds: int = ROUNDS, quick: bool = False) -> dict[str, Any]:
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    scale = 10 if quick else 1
    rounds = min(rounds, 3) if quick else rounds
    tpm_util = _quiet_keylime()
    with tempfile.TemporaryDirectory(prefix="nodegate-bench-") as tmp:
        evidence = collect_evidence(Path(tmp), tpm_util)
    groups = [_quote_group(k, evidence.quotes[k], tpm_util, QUOTE_CALLS // scale) for k in ("ecc", "rsa")]
    for kind in ("rsa", "ecc"):
        calls = (CREDENTIAL_CALLS if kind == "rsa" else ECC_CREDENTIAL_CALLS) // scale
        groups.append(
            _credential_group(evidence.ek_templates[kind], evidence.credentials[kind], tpm_util, calls)
        )
    started = time.perf_counter()
    measure(groups, rounds)
    config = {
        "rounds": rounds,
        "calls": {g.name: g.calls for g in groups},
        "selection": SELECTION,
        "timed_seconds": round(time.perf_counter() - started, 1),
    }
    return summarise(groups, config)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    results = run(rounds=args.rounds, quick=args.quick)
    print(json.dumps(results, separators=(",", ":")) if args.json else render(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
