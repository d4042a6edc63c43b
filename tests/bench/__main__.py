"""Run the benchmarks: ``python -m tests.bench [NAME ...] [--only NAME] [--json] [--quick] [--rounds R]``
(``make bench``).

Each benchmark is a module with ``main(argv) -> int`` that accepts the same options; add new ones
to ``BENCHMARKS``. Without names every benchmark runs, in order; with names (``admission``, or
``--only admission``, repeatable) just those. With ``--json`` each benchmark prints one JSON
object on one line (JSON Lines).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from tests.bench import (
    admission,
    admission_attacks,
    attest,
    bootrecords,
    disk,
    ekcert,
    eventlog,
    framing,
    gate,
    gate_churn,
    gate_cluster,
    join,
    joinload,
    soak,
    spiffe,
)

BENCHMARKS: dict[str, Callable[[Sequence[str] | None], int]] = {
    "attest": attest.main,
    "admission": admission.main,
    # Genuine reviews while issue 41's attacks run (nodegate serve, the attacker in its own process).
    "admission_attacks": admission_attacks.main,
    # The admission listener's framing against httptools (llhttp) and h11 (issue 41).
    "framing": framing.main,
    "join": join.main,
    "gate": gate.main,
    "eventlog": eventlog.main,
    "ekcert": ekcert.main,
    "soak": soak.main,
    "joinload": joinload.main,
    "spiffe": spiffe.main,
    "disk": disk.main,
    "bootrecords": bootrecords.main,
    # The real control plane (tests/cluster/plane.py; `make cluster` builds it).
    "gate_churn": gate_churn.main,
    "gate_cluster": gate_cluster.main,
}


def _select(args: list[str]) -> tuple[list[str], list[str]]:
    """Split the command line into benchmark names (positional or ``--only``) and the rest."""
    names: list[str] = []
    rest: list[str] = []
    it = iter(args)
    for arg in it:
        if arg == "--only" or arg.startswith("--only="):
            name = arg.partition("=")[2] if "=" in arg else next(it, "")
            names.append(name)
        elif arg in BENCHMARKS:
            names.append(arg)
        else:
            rest.append(arg)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise SystemExit(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(BENCHMARKS)}")
    return names, rest


def main(argv: Sequence[str] | None = None) -> int:
    names, args = _select(list(sys.argv[1:] if argv is None else argv))
    rc = 0
    for name, bench in BENCHMARKS.items():
        if not names or name in names:
            rc = max(rc, bench(args))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
