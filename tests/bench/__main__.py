"""Run every benchmark: ``python -m tests.bench [--json] [--quick] [--rounds R]`` (``make bench``).

Each benchmark is a module with ``main(argv) -> int`` that accepts the same options; add new ones
to ``BENCHMARKS``. With ``--json`` each benchmark prints one JSON object on one line (JSON Lines).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from tests.bench import attest

BENCHMARKS: list[Callable[[Sequence[str] | None], int]] = [
    attest.main,
]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    rc = 0
    for bench in BENCHMARKS:
        rc = max(rc, bench(args))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
