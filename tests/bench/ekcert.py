"""Benchmark of the EK certificate path (``attest.certparse`` + ``attest.ekcert``) against keylime's
EK certificate verification, on the same certificates.

Inputs: by default synthetic vendor-shaped chains (``tests.attest.ekbuild``: an RSA and an ECC
two-level chain, a Nuvoton-style unsorted-RDN root and leaf, a STMicro-style padded leaf under a
leading-zero-serial intermediate, an Intel OnDie-style NULL-parameter chain, a Google-style leaf
without EKU); with ``--certs DIR``, every certificate under DIR (recursively: *.pem, *.der, *.crt,
*.cer): CA certificates are the trust store, the others are the EK certificates judged (e.g. a
corpus of public vendor roots and EK certificates, docs/ek-roots.md); with ``--real``, the public
collection of vendor CAs and the real EK and AK certificates of the shared test data (``ek-roots/``
and ``tpm/``; Google Cloud, STMicro, ...; the AK certificates must be refused).

Cases, per EK certificate:
  ours          ``certparse.read_certificate`` + ``ekcert.verify_chain`` against the store loaded
                once (anchors = self-issued CAs, the rest intermediates): parse, every link's
                signature over the original TBS, validity, CA constraints, EK key usage
  ours+ek       (synthetic only, where the EK public area is known) ``tpm.verify_ek`` after
                ``tpm.clear_caches()``: the above plus the EK template and the key binding
  keylime       ``keylime.cert_utils.verify_ek(der, store_dir)`` as keylime's registrar and
                tenant call it: it reads and parses every *.pem of the store on each call and
                treats each as an anchor (one hop, no validity or usage checks)
  keylime-1     the same with a store holding only the certificates named as the leaf's issuer
                (keylime's best case: the store read costs least)

Method: R rounds; in each round every case runs a batch on every certificate, cases in a rotating
order; per-call times are medians over rounds and ratios are medians of per-round ratios. The
verdicts of both sides are reported per certificate (they differ by design: see docs/ek-roots.md).
Validity is judged one day after each leaf's notBefore, when every genuine chain was valid.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import statistics
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import rsa

from attest import certparse, ekcert, tpm
from attest.certparse import Cert
from attest.errors import AttestationError
from bootstrap.service.join import ekroots
from tests.attest import ekbuild as b
from tests.bench import common
from tests.support import realtpm
from tests.support.shared_data import shared

ROUNDS = 9
BATCH = {"ours": 20, "ours+ek": 20, "keylime": 1, "keylime-1": 10}


@dataclass
class Leaf:
    name: str
    data: bytes  # as a node would send it (padding and all)
    at: datetime
    ek_public: bytes | None = None


def _synthetic() -> tuple[list[Cert], list[Leaf]]:
    cas: list[b.Ca] = []
    leaves: list[Leaf] = []

    def add(name: str, issuer: b.Ca, kind: str, **kw: Any) -> None:
        key, public = b.ek_pair(kind)
        edit = kw.pop("edit", None)
        pad = kw.pop("pad", 0)
        der = b.issue_ek(issuer, b.ek_builder(issuer.name, key, **kw), edit=edit, hash_alg=hashes.SHA384())
        leaves.append(Leaf(name, der + b"\xff" * pad, b.NOW, public))

    rsa_root = b.make_ca(
        b.cn("Vendor RSA Root CA"), key=rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )
    rsa_inter = b.make_ca(
        b.cn("Vendor RSA Manufacturing CA 035"),
        parent=rsa_root,
        key=rsa.generate_private_key(public_exponent=65537, key_size=2048),
    )
    ecc_root = b.make_ca(b.cn("Vendor ECC Root CA"))
    ecc_inter = b.make_ca(b.cn("Vendor ECC Manufacturing CA 035"), parent=ecc_root)
    nuvo = b.nuvoton_name()
    nuvo_root = b.make_ca(nuvo.name, edit=b.replace_in_tbs(nuvo.sorted_der, nuvo.vendor_der))
    stm_root = b.make_ca(b.cn("STM TPM EK Root CA"))
    zeros = b.replace_in_tbs(bytes.fromhex("020101"), bytes.fromhex("020400000001"))
    stm_inter = b.make_ca(b.cn("STM TPM EK Intermediate CA 05"), parent=stm_root, serial=1, edit=zeros)
    null = b.replace_in_tbs(b.ECDSA_SHA384, b.ECDSA_SHA384_NULL)
    intel_root = b.make_ca(
        b.cn("OnDie CA Root Cert Signing"),
        edit=null,
        outer_alg=lambda a: a.replace(b.ECDSA_SHA384, b.ECDSA_SHA384_NULL),
    )
    intel_inter = b.make_ca(b.cn("OnDie CA CSME Intermediate CA"), parent=intel_root)
    gce_root = b.make_ca(b.cn("EK/AK CA Root"))
    gce_inter = b.make_ca(b.cn("EK/AK CA Intermediate"), parent=gce_root)
    cas += [
        rsa_root,
        rsa_inter,
        ecc_root,
        ecc_inter,
        nuvo_root,
        stm_root,
        stm_inter,
        intel_root,
        intel_inter,
        gce_root,
        gce_inter,
    ]
    san = b.tpm_san_name()
    add("rsa-2level", rsa_inter, "rsa", san=b.cn("tpm"))
    add("ecc-2level", ecc_inter, "ecc", san=b.cn("tpm"))
    unsorted = b.chain_edits(
        b.replace_in_tbs(nuvo.sorted_der, nuvo.vendor_der), b.replace_in_tbs(san.sorted_der, san.vendor_der)
    )
    add("nuvoton-unsorted-rdn", nuvo_root, "rsa", san=san.name, edit=unsorted)
    add("stmicro-nv-padding", stm_inter, "rsa", san=b.cn("tpm"), pad=431)
    add("intel-ondie-null", intel_inter, "ecc", san=b.cn("tpm"))
    add("google-no-eku", gce_inter, "ecc", eku=False, subject=b.cn("218557372616137117"))
    store = [certparse.read_certificate(ca.der, trailing=certparse.FILE_WHITESPACE) for ca in cas]
    return store, leaves


def _real() -> tuple[list[Cert], list[Leaf]]:
    """The public collection of vendor CAs (shared data ek-roots/, 198 CAs: the store nodegate
    once shipped), and the real EK and AK certificates with their EKs' public areas."""
    roots = ekroots.load_roots([shared("ek-roots").folder()])
    leaves = []
    for name in realtpm.named("ek-certificate") + realtpm.named("ak-certificate"):
        der = realtpm.certificate_bytes(name)
        cert = certparse.read_certificate(der)
        leaves.append(Leaf(name, der, realtpm.valid_at(cert), realtpm.ek_public_for(cert.key)))
    return [*roots.anchors, *roots.intermediates], leaves


def _corpus(folder: Path) -> tuple[list[Cert], list[Leaf]]:
    store: list[Cert] = []
    leaves: list[Leaf] = []
    for path in sorted(p for p in folder.rglob("*") if p.suffix.lower() in {".pem", ".der", ".crt", ".cer"}):
        data = path.read_bytes()
        blobs = list(certparse.pem_blocks(data)) if certparse.is_pem(data) else [data]
        for der in blobs:
            cert = _read_any(der)
            if cert is None:
                continue
            if _is_ca(cert):
                store.append(cert)
            else:
                at = cert.view.not_valid_before_utc + timedelta(days=1)
                leaves.append(Leaf(str(path.relative_to(folder)), der, at))  # as read: NV padding too
    unique = {c.sha256: c for c in store}
    return list(unique.values()), leaves


def _read_any(der: bytes) -> Cert | None:
    for trailing in (certparse.NV_PADDING, certparse.FILE_WHITESPACE):
        try:
            return certparse.read_certificate(der, trailing=trailing)
        except AttestationError:
            continue
    return None


def _is_ca(cert: Cert) -> bool:
    try:
        return bool(cert.view.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _pem(der: bytes) -> str:
    return "-----BEGIN CERTIFICATE-----\n" + base64.encodebytes(der).decode() + "-----END CERTIFICATE-----\n"


def _write_store(folder: Path, certs: Sequence[Cert]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, cert in enumerate(certs):
        (folder / f"ca-{i:04d}.pem").write_text(_pem(cert.der))
    return folder


def _ours(leaf: Leaf, anchors: list[Cert], inter: list[Cert]) -> Callable[[], bool]:
    def run() -> bool:
        try:
            ekcert.verify_chain(certparse.read_certificate(leaf.data), anchors, inter, leaf.at)
        except AttestationError:
            return False
        return True

    return run


def _ours_ek(leaf: Leaf, anchors: list[Cert], inter: list[Cert]) -> Callable[[], bool]:
    def run() -> bool:
        tpm.clear_caches()
        assert leaf.ek_public is not None
        try:
            tpm.verify_ek(leaf.ek_public, leaf.data, roots=anchors, intermediates=inter, now=leaf.at)
        except AttestationError:
            return False
        return True

    return run


def _keylime(leaf: Leaf, store: Path) -> Callable[[], bool]:
    from keylime import cert_utils  # optional: only this benchmark needs keylime (and pyasn1)

    def run() -> bool:
        try:
            return bool(cert_utils.verify_ek(leaf.data, str(store)))
        except Exception:  # noqa: BLE001  (keylime raises a bare Exception on certificates it cannot parse)
            return False

    return run


def run(*, rounds: int, quick: bool, certs: Path | None = None, real: bool = False) -> dict[str, Any]:
    logging.getLogger("keylime").setLevel(logging.CRITICAL)
    warnings.simplefilter("ignore")  # keylime's pyasn1 path warns about long names in some vendor CAs
    if real:
        store, leaves = _real()
    else:
        store, leaves = _corpus(certs) if certs else _synthetic()
    anchors = [c for c in store if c.self_issued]
    inter = [c for c in store if not c.self_issued]
    with tempfile.TemporaryDirectory() as tmp:
        full = _write_store(Path(tmp) / "store", store)
        cases: dict[str, dict[str, Callable[[], bool]]] = {}
        for i, leaf in enumerate(leaves):
            issuer = certparse.read_certificate(leaf.data).issuer
            own = _write_store(Path(tmp) / f"issuer-{i}", [c for c in store if c.subject == issuer])
            cases[leaf.name] = {
                "ours": _ours(leaf, anchors, inter),
                "keylime": _keylime(leaf, full),
                "keylime-1": _keylime(leaf, own),
            }
            if leaf.ek_public is not None:
                cases[leaf.name]["ours+ek"] = _ours_ek(leaf, anchors, inter)
        verdicts = {name: {case: fn() for case, fn in by.items()} for name, by in cases.items()}
        order = [c for c in BATCH if any(c in by for by in cases.values())]
        scale = 0.1 if quick else 1.0
        rounds = 3 if quick else rounds
        per_round: list[dict[str, float]] = []
        for r in range(rounds):
            totals = dict.fromkeys(order, 0.0)
            rotated = order[r % len(order) :] + order[: r % len(order)]
            for by in cases.values():
                for case in rotated:
                    if case in by:
                        totals[case] += common.per_call_us(by[case], max(1, int(BATCH[case] * scale)))
            per_round.append(totals)
    n = len(cases)
    med = {c: statistics.median(t[c] for t in per_round) / n for c in order}
    return {
        "benchmark": "ekcert",
        "source": "tests/fixtures/tpm + the shipped store" if real else str(certs) if certs else "synthetic",
        "certificates": n,
        "store": {"anchors": len(anchors), "intermediates": len(inter)},
        "rounds": rounds,
        "quick": quick,
        "us_per_certificate": med,
        "ours_vs_keylime_throughput": statistics.median(t["keylime"] / t["ours"] for t in per_round),
        "ours_vs_keylime_issuer_only_throughput": statistics.median(
            t["keylime-1"] / t["ours"] for t in per_round
        ),
        "verdicts": verdicts,
        "versions": common.versions(["keylime", "cryptography"]),
    }


def render(res: dict[str, Any]) -> str:
    lines = [
        f"ekcert: {res['certificates']} EK certificates from {res['source']}, store of "
        f"{res['store']['anchors']} anchors + {res['store']['intermediates']} intermediates, "
        f"{res['rounds']} rounds{' (quick)' if res['quick'] else ''}",
        "  case        µs per certificate (median over rounds, mean over certificates)",
    ]
    lines += [f"  {case:<10} {us:>12,.0f}" for case, us in res["us_per_certificate"].items()]
    lines += [
        f"  ours vs keylime throughput: {res['ours_vs_keylime_throughput']:.1f}x "
        f"(keylime-1, issuer-only store: {res['ours_vs_keylime_issuer_only_throughput']:.1f}x)",
        "  verdicts (ours / keylime):",
    ]
    for name, v in res["verdicts"].items():
        mark = "" if v["ours"] == v["keylime"] else "   <- differ"
        lines.append(f"    {_yes(v['ours'])} / {_yes(v['keylime'])}  {name}{mark}")
    return "\n".join(lines)


def _yes(value: bool) -> str:
    return "trusted" if value else "refused"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.bench ekcert", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the results as one JSON object on one line")
    p.add_argument("--rounds", type=common.positive, default=ROUNDS, help=f"timed rounds (default {ROUNDS})")
    p.add_argument("--quick", action="store_true", help="a smoke run: 3 rounds of a tenth of the calls")
    p.add_argument(
        "--certs", type=Path, metavar="DIR", help="a corpus of CA and EK certificates to use instead"
    )
    p.add_argument(
        "--real",
        action="store_true",
        help="the shipped vendor store and the real EK/AK certificates of tests/fixtures/tpm",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    results = run(rounds=args.rounds, quick=args.quick, certs=args.certs, real=args.real)
    print(json.dumps(results, separators=(",", ":")) if args.json else render(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
