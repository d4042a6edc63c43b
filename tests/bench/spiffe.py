"""nodegate's SPIFFE ID and bundle parsing against py-spiffe's (``spiffe`` on PyPI), on the same inputs:
speed, and the verdicts on inputs the SPIFFE specs forbid (docs/spire.md, "py-spiffe").

Cases:
  id            ``attest.spiffeid.parse_spiffe_id`` vs ``spiffe.SpiffeId(text)`` on valid IDs of
                several shapes (short, deep, near the 2048-byte limit)
  pem-bundle    what nodegate does with a PEM bundle (``x509.load_pem_x509_certificates``) vs
                ``spiffe.X509Bundle.parse(trust_domain, pem)``, on a bundle of two roots
  jwks-bundle   ``attest.bundle.parse_bundle_document`` (the SPIFFE bundle, a JWK Set);
                py-spiffe has no X.509 JWK Set parser, so there is no counterpart (reported)
Strictness: each side's verdict on IDs the SPIFFE-ID spec forbids.

Method: R rounds; each round times a batch of every case on both sides, in a rotating order;
per-call times are medians over rounds, ratios medians of per-round ratios. The load average
(os.getloadavg) is reported before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from spiffe import SpiffeId, TrustDomain, X509Bundle
from spiffe.errors import PySpiffeError

from attest import bundle, ca, spiffeid
from tests.bench import common

ROUNDS = 9
BATCH = 2000

VALID = [
    "spiffe://example.org/node/gpu-017",
    "spiffe://fleet.example.com/spire/agent/x509pop/node-a",
    "spiffe://td/" + "/".join(f"seg{i}" for i in range(40)),
    "spiffe://example.org/" + "a" * 2000,
]
# Inputs the SPIFFE-ID spec forbids (or that are not canonical), and why.
FORBIDDEN = {
    "trailing newline": "spiffe://example.org/a\n",
    "trailing newline, root": "spiffe://example.org\n",
    "longer than 2048 bytes": "spiffe://example.org/" + "a" * 2100,
    "trust domain of 256 bytes": "spiffe://" + "a" * 256 + "/x",
    "empty segment": "spiffe://example.org/a//b",
    "dot segment": "spiffe://example.org/a/../b",
    "percent-encoded": "spiffe://example.org/a%20b",
    "port": "spiffe://example.org:8443/a",
    "userinfo": "spiffe://u@example.org/a",
    "query": "spiffe://example.org/a?x=1",
    "trailing slash": "spiffe://example.org/a/",
    "non-ASCII letter in the trust domain": "spiffe://exampl\u212a.org/a",
}


def _ours_id(text: str) -> bool:
    try:
        spiffeid.parse_spiffe_id(text)
    except spiffeid.SpiffeIdError:
        return False
    return True


def _theirs_id(text: str) -> bool:
    try:
        SpiffeId(text)
    except (PySpiffeError, ValueError):
        return False
    return True


def _bundle_inputs() -> tuple[bytes, bytes]:
    now = datetime.now(UTC)
    cas = ca.initial("example.org", now=now).rotate(now=now, grace=timedelta(hours=1))
    roots = cas.roots(now)
    doc = json.dumps(bundle.bundle_document(roots, sequence=2, refresh_hint=300)).encode()
    return bundle.bundle_pem(roots), doc


def run(*, rounds: int, quick: bool) -> dict[str, Any]:
    pem, jwks = _bundle_inputs()
    td = TrustDomain("example.org")
    cases: dict[str, dict[str, Callable[[], object]]] = {
        "id": {
            "ours": lambda: [spiffeid.parse_spiffe_id(t) for t in VALID],
            "py-spiffe": lambda: [SpiffeId(t) for t in VALID],
        },
        "pem-bundle": {
            "ours": lambda: x509.load_pem_x509_certificates(pem),
            "py-spiffe": lambda: X509Bundle.parse(td, pem),
        },
        "jwks-bundle": {"ours": lambda: bundle.parse_bundle_document(jwks)},
    }
    load_before = os.getloadavg()
    rounds = 3 if quick else rounds
    batch = BATCH // 10 if quick else BATCH
    per_round: list[dict[str, dict[str, float]]] = []
    sides = [(c, s) for c, by in cases.items() for s in by]
    for r in range(rounds):
        shift = r % len(sides)
        timed: dict[str, dict[str, float]] = {c: {} for c in cases}
        for case, side in sides[shift:] + sides[:shift]:
            timed[case][side] = common.per_call_us(cases[case][side], batch)
        per_round.append(timed)
    us = {c: {s: statistics.median(t[c][s] for t in per_round) for s in by} for c, by in cases.items()}
    ratios = {
        c: statistics.median(t[c]["py-spiffe"] / t[c]["ours"] for t in per_round)
        for c, by in cases.items()
        if "py-spiffe" in by
    }
    verdicts = {why: {"ours": _ours_id(t), "py-spiffe": _theirs_id(t)} for why, t in FORBIDDEN.items()}
    return {
        "benchmark": "spiffe",
        "rounds": rounds,
        "quick": quick,
        "us_per_call": us,
        "ours_vs_py_spiffe_throughput": ratios,
        "accepted_forbidden_ids": verdicts,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "versions": common.versions(["spiffe", "cryptography"]),
    }


def render(res: dict[str, Any]) -> str:
    lines = [
        f"spiffe: nodegate vs py-spiffe {res['versions']['spiffe']}, {res['rounds']} rounds"
        f"{' (quick)' if res['quick'] else ''}, "
        f"load {res['loadavg_before'][0]:.1f} -> {res['loadavg_after'][0]:.1f}",
        "  case          side        µs per call (median over rounds)",
    ]
    for case, by in res["us_per_call"].items():
        for side, value in by.items():
            lines.append(f"  {case:<13} {side:<10} {value:>10,.1f}")
        if case in res["ours_vs_py_spiffe_throughput"]:
            lines.append(
                f"  {case:<13} ours vs py-spiffe throughput: {res['ours_vs_py_spiffe_throughput'][case]:.2f}x"
            )
        elif case == "jwks-bundle":
            lines.append(f"  {case:<13} py-spiffe has no X.509 JWK Set parser")
    lines.append("  forbidden IDs accepted (ours / py-spiffe):")
    for why, v in res["accepted_forbidden_ids"].items():
        lines.append(f"    {_yes(v['ours'])} / {_yes(v['py-spiffe'])}  {why}")
    return "\n".join(lines)


def _yes(value: bool) -> str:
    return "ACCEPTED" if value else "refused "


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.bench spiffe", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the results as one JSON object on one line")
    p.add_argument("--rounds", type=common.positive, default=ROUNDS, help=f"timed rounds (default {ROUNDS})")
    p.add_argument("--quick", action="store_true", help="a smoke run: 3 rounds of a tenth of the calls")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    results = run(rounds=args.rounds, quick=args.quick)
    print(json.dumps(results) if args.json else render(results))
    return 0
