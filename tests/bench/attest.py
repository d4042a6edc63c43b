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

MakeCredential, per EK (bytes in, bytes out; each result is first checked by ActivateCredential
on the swtpm, so only outputs that really work are timed):
  ours warm   ``tpm.make_credential`` with the EK already in the parsed-key cache
  ours cold   ``tpm.clear_caches()`` + ``tpm.make_credential``
  keylime     ``tpm_util.makecredential`` (parses the EK every call; tpm2-tools output format)
  tpm2-pytss  ``TPM2B_PUBLIC.unmarshal`` + ``tpm2_pytss.utils.make_credential`` + ``marshal``
  floor       RSA EK: one RSA-OAEP(SHA-256, label "IDENTITY") encryption of 32 bytes;
              ECC EK: one ephemeral key generation + ECDH exchange on the EK's curve

Method: a warm-up batch per case, then R rounds; each round runs every case once (interleaved,
starting at a different case each round) as one untimed call plus a batch of N timed calls
(``time.perf_counter_ns``, garbage collector paused). A round gives one per-call time per case;
the table shows the median and the 90th percentile over rounds.

How to read the table:
  µs/op         median per-call time over rounds (p90 beside it shows the spread)
  vs keylime    throughput ratio case / keylime (= keylime time / case time); > 1 is faster
  vs floor      time ratio case / floor; 1.00x means nothing is spent beyond the crypto itself
The targets at the end are reported, never asserted; the exit code is 0 unless something crashes.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import logging
import os
import platform
import statistics
import struct
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

os.environ.setdefault("TSS2_LOG", "all+none")  # before tpm2_pytss loads libtss2

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from attest import tpm, wire
from attest.keys import public_key

SELECTION = "sha256:0,1,2,3,4,5,6,7"
QUOTE_CALLS = 200
CREDENTIAL_CALLS = 100
ROUNDS = 15

OURS, KEYLIME, PYTSS, FLOOR = "ours", "keylime", "tpm2-pytss", "floor"


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
    from keylime.tpm import tpm_util

    logging.getLogger("keylime").setLevel(logging.ERROR)
    return tpm_util


def _keylime_credential(
    tpm_util: Any, ek_public: bytes, ak_name: bytes, secret: bytes
) -> tuple[bytes, bytes]:
    """keylime's makecredential, its tpm2-tools output split into (TPM2B_ID_OBJECT, TPM2B_ENCRYPTED_SECRET)."""
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
    from bootstrap import swtpm
    from bootstrap.agent import Agent

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
        for ek_kind, ak_kind in (("rsa", "ecc"), ("ecc", "rsa")):
            with Agent(server.tcti) as node:
                ek = node.create_ek(ek_kind)  # type: ignore[arg-type]
                ak = node.create_ak(ak_kind)  # type: ignore[arg-type]
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
    group: str
    label: str
    impl: str  # OURS, KEYLIME, PYTSS or FLOOR
    calls: int
    fn: Callable[[], object]
    target_floor: bool = True  # whether "ours within 1.3x of the floor" applies
    samples: list[float] = field(default_factory=list)  # ns per call, one per round

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def p90(self) -> float:
        if len(self.samples) < 2:
            return self.samples[0]
        return statistics.quantiles(self.samples, n=10, method="inclusive")[-1]


@dataclass(frozen=True)
class Skipped:
    group: str
    label: str
    note: str


def _quote_cases(kind: str, ev: QuoteEvidence, tpm_util: Any, calls: int) -> list[Case]:
    ak = tpm.verify_ak(ev.ak_public)
    group = "quote, ECC P-256 AK" if kind == "ecc" else "quote, RSA-2048 AK"
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
        der = encode_dss_signature(int.from_bytes(sig.r, "big"), int.from_bytes(sig.s, "big"))
        ecdsa = ec.ECDSA(hashes.SHA256())
        ec_verify = key.verify

        def floor() -> object:
            return ec_verify(der, quote, ecdsa)

        floor_label = "floor: ECDSA P-256 verify"
    else:
        assert isinstance(key, rsa.RSAPublicKey)
        raw, pkcs1, sha256 = sig.sig, padding.PKCS1v15(), hashes.SHA256()
        rsa_verify = key.verify

        def floor() -> object:
            return rsa_verify(raw, quote, pkcs1, sha256)

        floor_label = "floor: RSA PKCS1v15 verify"

    # Every case must accept this quote before it is timed.
    expected = {i: v.hex() for i, v in pcrs["sha256"].items()}
    for check in (warm, cold):
        result = check()
        assert isinstance(result, tpm.QuoteResult) and result.pcrs == pcrs, "verify_quote result"
    assert keylime() == expected, "keylime checkquote did not return the quoted PCRs"
    floor()
    return [
        Case(group, "ours warm (AK cached)", OURS, calls, warm),
        Case(group, "ours cold (clear_caches + verify)", OURS, calls, cold),
        Case(group, "keylime checkquote", KEYLIME, calls, keylime),
        Case(group, floor_label, FLOOR, calls, floor),
    ]


def _credential_cases(
    kind: str, template: str, cred: CredentialInput, tpm_util: Any, calls: int
) -> tuple[list[Case], list[Skipped]]:
    group = f"make_credential, {template} EK"
    ek_public, ak_name = cred.ek_public, cred.ak_name
    secret = os.urandom(32)
    make, clear_caches = tpm.make_credential, tpm.clear_caches
    keylime_make = tpm_util.makecredential

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

        def floor() -> object:
            return encrypt(seed, oaep)

        floor_label = "floor: RSA-OAEP encrypt 32 B"
    else:
        curve, ecdh, generate = key.curve, ec.ECDH(), ec.generate_private_key

        def floor() -> object:
            return generate(curve).exchange(ecdh, key)

        floor_label = f"floor: ECDH keygen + exchange {curve.name}"

    cases = [
        Case(group, "ours warm (EK cached)", OURS, calls, warm),
        Case(group, "ours cold (clear_caches + make)", OURS, calls, cold),
    ]
    skipped = []
    for impl, label, fn in (
        (KEYLIME, "keylime makecredential", keylime),
        (PYTSS, "tpm2-pytss make_credential", pytss),
    ):
        if impl in cred.broken:
            skipped.append(Skipped(group, label, cred.broken[impl]))
        else:
            cases.append(Case(group, label, impl, calls, fn))
    cases.append(Case(group, floor_label, FLOOR, calls, floor))
    for case in cases:
        case.fn()
    return cases, skipped


# ------------------------------------------------------------------------------------------
# Timing


def _batch(fn: Callable[[], object], calls: int) -> float:
    """Per-call time in ns of ``calls`` back-to-back calls, the garbage collector paused."""
    fn()  # untimed: restores whatever state another case may have disturbed (the caches)
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


def measure(cases: list[Case], rounds: int) -> None:
    for case in cases:  # warm-up: one batch each, discarded
        _batch(case.fn, case.calls)
    for r in range(rounds):
        shift = r % len(cases)
        for case in cases[shift:] + cases[:shift]:
            case.samples.append(_batch(case.fn, case.calls))


# ------------------------------------------------------------------------------------------
# Results


def _reference(cases: list[Case], group: str, impl: str) -> Case | None:
    return next((c for c in cases if c.group == group and c.impl == impl), None)


def summarise(cases: list[Case], skipped: list[Skipped], config: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for case in cases:
        keylime = _reference(cases, case.group, KEYLIME)
        floor = _reference(cases, case.group, FLOOR)
        rows.append(
            {
                "group": case.group,
                "case": case.label,
                "impl": case.impl,
                "calls_per_round": case.calls,
                "rounds": len(case.samples),
                "median_us": case.median / 1000,
                "p90_us": case.p90 / 1000,
                "min_us": min(case.samples) / 1000,
                "ops_per_s": 1e9 / case.median,
                "vs_keylime": keylime.median / case.median if keylime else None,
                "vs_floor": case.median / floor.median if floor else None,
            }
        )
    targets = []
    for row in rows:
        if row["impl"] != OURS:
            continue
        what = f"{row['group']}: {row['case']}"
        if row["vs_keylime"] is not None:
            need = 1.5 if row["group"].startswith("quote") else 1.0
            targets.append(
                {
                    "target": f"{what} >= {need:g}x keylime throughput",
                    "value": row["vs_keylime"],
                    "threshold": need,
                    "met": row["vs_keylime"] >= need,
                }
            )
        if row["vs_floor"] is not None:
            targets.append(
                {
                    "target": f"{what} <= 1.3x floor time",
                    "value": row["vs_floor"],
                    "threshold": 1.3,
                    "met": row["vs_floor"] <= 1.3,
                }
            )
    for skip in skipped:
        if skip.label.startswith("keylime"):
            targets.append(
                {
                    "target": f"{skip.group}: vs keylime",
                    "value": None,
                    "threshold": None,
                    "met": None,
                    "note": skip.note,
                }
            )
    return {
        "benchmark": "attest",
        "environment": _environment(),
        "config": config,
        "cases": rows,
        "skipped": [{"group": s.group, "case": s.label, "note": s.note} for s in skipped],
        "targets": targets,
    }


def _environment() -> dict[str, Any]:
    from cryptography.hazmat.backends.openssl.backend import backend

    versions = {}
    for dist in ("cryptography", "keylime", "tpm2-pytss", "nodegate"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
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
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    lines = [
        "attest benchmark: TPM quote verification and MakeCredential",
        f"  Python {env['python']} ({env['implementation']}, {env['machine']}, {env['cpus']} CPUs), "
        f"{env['openssl']}",
        f"  {versions}",
        f"  {config['rounds']} rounds; per round {config['quote_calls']} calls per quote case and "
        f"{config['credential_calls']} per credential case; median and p90 over rounds",
        "",
    ]
    header = f"  {'case':<40} {'µs/op':>9} {'p90':>9} {'ops/s':>9} {'vs keylime':>11} {'vs floor':>9}"
    group = None
    for row in results["cases"]:
        if row["group"] != group:
            group = row["group"]
            lines += [group, header]
        lines.append(
            f"  {row['case']:<40} {row['median_us']:>9.1f} {row['p90_us']:>9.1f} "
            f"{row['ops_per_s']:>9,.0f} {_ratio(row['vs_keylime']):>11} {_ratio(row['vs_floor']):>9}"
        )
        for skip in results["skipped"]:
            if skip["group"] == group and row["impl"] == FLOOR:
                lines.append(f"  {skip['case']:<40} skipped: {skip['note']}")
        if row["impl"] == FLOOR:
            lines.append("")
    lines += ["  vs keylime: throughput case/keylime (higher is better); vs floor: time case/floor", ""]
    lines.append("targets (reported, not asserted)")
    for t in results["targets"]:
        if t["met"] is None:
            lines.append(f"  n/a   {t['target']}: {t.get('note', '')}")
        else:
            lines.append(f"  {'met ' if t['met'] else 'MISS'}  {t['target']:<78} {t['value']:.2f}x")
    met = sum(1 for t in results["targets"] if t["met"])
    judged = sum(1 for t in results["targets"] if t["met"] is not None)
    lines.append(f"  {met} of {judged} targets met")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# Entry point


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--rounds", type=int, default=ROUNDS, help=f"timed rounds per case (default {ROUNDS})")
    p.add_argument("--quick", action="store_true", help="a smoke run: 3 rounds of a tenth of the calls")
    return p


def run(rounds: int = ROUNDS, quick: bool = False) -> dict[str, Any]:
    quote_calls, credential_calls = QUOTE_CALLS, CREDENTIAL_CALLS
    if quick:
        rounds, quote_calls, credential_calls = min(rounds, 3), quote_calls // 10, credential_calls // 10
    tpm_util = _quiet_keylime()
    with tempfile.TemporaryDirectory(prefix="nodegate-bench-") as tmp:
        evidence = collect_evidence(Path(tmp), tpm_util)
    cases: list[Case] = []
    skipped: list[Skipped] = []
    for kind in ("ecc", "rsa"):
        cases += _quote_cases(kind, evidence.quotes[kind], tpm_util, quote_calls)
    for kind in ("rsa", "ecc"):
        more, skip = _credential_cases(
            kind, evidence.ek_templates[kind], evidence.credentials[kind], tpm_util, credential_calls
        )
        cases += more
        skipped += skip
    started = time.perf_counter()
    measure(cases, rounds)
    config = {
        "rounds": rounds,
        "quote_calls": quote_calls,
        "credential_calls": credential_calls,
        "selection": SELECTION,
        "timed_seconds": round(time.perf_counter() - started, 2),
    }
    return summarise(cases, skipped, config)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    results = run(rounds=args.rounds, quick=args.quick)
    if args.json:
        print(json.dumps(results, separators=(",", ":")))
    else:
        print(render(results))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
