"""Command line: ``nodegate`` and ``kubectl-nodegate``.

The arguments of every command are in ``arguments`` (argparse only). Each command group has a
module here that does the work; only the chosen one is imported (``COMMANDS``), so ``nodegate
serve`` never loads the TPM stack and ``nodegate join`` never loads the Kubernetes client.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from bootstrap import logs
from bootstrap.cli.arguments import parser

# command -> module under bootstrap.cli with run(args) -> exit code
COMMANDS = {
    "serve": "serve",
    "gate": "gate",
    "join": "node",
    "renew": "node",
    "attest": "node",
    "ca": "ca",
    "policy": "policy",
    "eventlog": "eventlog",
    "backup": "backup",
    "restore": "backup",
    "demo": "demo",
    "ek": "ek",
    "config": "config",
    "nodes": "nodes",
}


def main(argv: Sequence[str] | None = None) -> int:
    logs.capture_warnings()
    p = parser()
    args = p.parse_args(argv)
    try:
        args.log_level_value = logs.level_named(args.log_level)
    except ValueError as exc:
        print(f"nodegate: {exc}", file=sys.stderr)
        return 2
    if args.command is None:
        p.print_help()
        return 0
    module = importlib.import_module(f"bootstrap.cli.{COMMANDS[args.command]}")
    code: int = module.run(args)
    return code


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl nodegate status ...`` (kubectl finds ``kubectl-nodegate`` on PATH)."""
    module = importlib.import_module("bootstrap.gate.kubectl")
    code: int = module.main(argv)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
