"""``clevis-encrypt-nodegate`` and ``clevis-decrypt-nodegate``: the Clevis pin's two programs
(console scripts of the node wheel; Clevis finds them on PATH). What they do is
``bootstrap.node.disk.pin``; here only Clevis's calling convention:

    clevis-encrypt-nodegate CONFIG [-y] < PLAINTEXT > JWE    (``--summary``: one line for ``clevis``)
    clevis-decrypt-nodegate < JWE > PLAINTEXT

Exit 0; 1 refused or not opened (one line on stderr with the machine code); 2 usage.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from bootstrap.cli.common import node_log
from bootstrap.node.disk import jwe, pin
from bootstrap.node.errors import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    JoinFailed,
    JoinUsageError,
    report_failure,
)

SUMMARY = "Encrypts with a disk key nodegate releases only to this node's attested boot"
MAX_PLAINTEXT = 64 * 1024  # a LUKS passphrase, or a secret of sss


def _usage(prog: str, text: str) -> int:
    print(f"\nUsage: {prog} {text}\n\n{SUMMARY}\n", file=sys.stderr)
    return EXIT_USAGE


def _stdin(limit: int) -> bytes:
    data = sys.stdin.buffer.read(limit + 1)
    if len(data) > limit:
        raise JoinUsageError(f"standard input is larger than {limit} bytes")
    return data


def encrypt_main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    prog = "clevis encrypt nodegate"
    if args == ["--summary"]:
        print(SUMMARY)
        return EXIT_OK
    # ``clevis luks bind -y`` passes -y on to every pin (tang's "trust the advertisement"); the
    # server's identity here is the CA bundle, so it changes nothing.
    if len(args) not in (1, 2) or args[1:] not in ([], ["-y"]) or sys.stdin.isatty():
        return _usage(prog, "CONFIG [-y] < PLAINTEXT > JWE")
    node_log("disk")
    try:
        out = asyncio.run(pin.encrypt(args[0], _stdin(MAX_PLAINTEXT)))
    except (JoinUsageError, JoinFailed) as exc:
        return report_failure(prog, exc)
    sys.stdout.write(out)
    sys.stdout.flush()
    return EXIT_OK


def decrypt_main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    prog = "clevis decrypt nodegate"
    if args == ["--summary"]:
        print(SUMMARY)
        return EXIT_OK
    if args or sys.stdin.isatty():
        return _usage(prog, "< JWE > PLAINTEXT")
    node_log("disk")
    try:
        text = _stdin(jwe.MAX_JWE).decode("ascii")
        out = asyncio.run(pin.decrypt(text))
    except UnicodeDecodeError:
        print(f"{prog}: standard input is not a compact JWE", file=sys.stderr)
        return EXIT_REFUSED
    except jwe.JweError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except (JoinUsageError, JoinFailed) as exc:
        return report_failure(prog, exc)
    sys.stdout.buffer.write(out)
    sys.stdout.flush()
    return EXIT_OK
