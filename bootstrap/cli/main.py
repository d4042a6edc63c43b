"""Command line: ``nodegate`` and ``kubectl-nodegate``.

The arguments of every command are in ``arguments`` (argparse only). Each command group has a
module here that does the work; only the chosen one is imported (``COMMANDS``), so ``nodegate
serve`` never loads the TPM stack and ``nodegate join`` never loads the Kubernetes client.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Final

from bootstrap.cli.arguments import parser
from bootstrap.logs import setup as logs

SIGPIPE_EXIT: Final = 141

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
    "disk": "disk",
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
    return _closed_stdout_is_quiet(lambda: module.run(args))


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl nodegate status ...`` (kubectl finds ``kubectl-nodegate`` on PATH)."""
    module = importlib.import_module("bootstrap.gate.kubectl")
    return _closed_stdout_is_quiet(lambda: module.main(argv))


def _closed_stdout_is_quiet(command: Callable[[], int]) -> int:
    """``nodegate ek roots | head``: the reader went away, which is not an error of ours. No
    traceback, no message; exit 141 (128 + SIGPIPE), as a coreutils command in the same pipe."""
    try:
        code = command()
        sys.stdout.flush()  # output still buffered fails here, not in the interpreter's exit
    except BrokenPipeError:
        _silence_stdout()
        return SIGPIPE_EXIT
    return code


def _silence_stdout() -> None:
    # the interpreter flushes stdout once more at exit; point it at /dev/null so that is quiet too
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a replaced stdout (tests) has no descriptor
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


if __name__ == "__main__":
    raise SystemExit(main())
