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
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TSS2_LOG", "all+none")  # before tpm2_pytss loads libtss2

from tests.bench import common
from tests.bench.attest_cases import credential_group, measure, quote_group
from tests.bench.attest_evidence import SELECTION, collect_evidence, quiet_keylime
from tests.bench.attest_report import render, summarise

QUOTE_CALLS = 200  # per timed batch; a batch takes 10-60 ms
CREDENTIAL_CALLS = 100
ECC_CREDENTIAL_CALLS = 25  # each call is ~1 ms (P-384 keygen + ECDH), so fewer keep batches short
ROUNDS = 25


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
    tpm_util = quiet_keylime()
    with tempfile.TemporaryDirectory(prefix="nodegate-bench-") as tmp:
        evidence = collect_evidence(Path(tmp), tpm_util)
    groups = [quote_group(k, evidence.quotes[k], tpm_util, QUOTE_CALLS // scale) for k in ("ecc", "rsa")]
    for kind in ("rsa", "ecc"):
        calls = (CREDENTIAL_CALLS if kind == "rsa" else ECC_CREDENTIAL_CALLS) // scale
        groups.append(
            credential_group(evidence.ek_templates[kind], evidence.credentials[kind], tpm_util, calls)
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
