"""``nodegate disk``: the node's actions (``disknode``: the TPM stack, no Kubernetes client) and the
operator's (``diskops``: the store and the secret, no TPM stack), each loaded only when chosen."""

from __future__ import annotations

import argparse
import importlib

NODE_ACTIONS = frozenset({"unlock", "rekey", "status"})


def run(args: argparse.Namespace) -> int:
    name = "disknode" if args.disk_command in NODE_ACTIONS else "diskops"
    module = importlib.import_module(f"bootstrap.cli.{name}")
    code: int = module.run(args)
    return code
