"""``nodegate gate [--once]``: the hold gate alone, or one pass.

Exit codes: 0 done (or stopped by a signal), 1 a pass with errors, 2 config or cluster errors,
3 another gate holds the Lease (--once).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys

from bootstrap.cli.common import settings
from bootstrap.config import Settings
from bootstrap.gate import Gate, GateReport, LeaseHeld
from bootstrap.kube import Kube, KubeUnavailable
from bootstrap.logs import setup as logs


def run(args: argparse.Namespace) -> int:
    config = settings(args.config)
    if config is None:
        return 2
    logs.configure(getattr(args, "log_level_value", logging.INFO))
    try:
        return asyncio.run(_run(config, once=args.once, lease=not args.no_lease, output=args.output))
    except KubeUnavailable as exc:  # KubeConfigError: a kubeconfig that cannot be used
        print(f"nodegate gate: {exc}", file=sys.stderr)
        return 2


async def _run(config: Settings, *, once: bool, lease: bool, output: str = "text") -> int:
    kube = await Kube.from_settings(config.kubernetes)
    if kube is None:
        print(
            "nodegate gate: no cluster: set kubernetes.kubeconfig in the config, or run in a pod",
            file=sys.stderr,
        )
        return 2
    gate = Gate.for_settings(kube, config)
    try:
        if once:
            try:
                report = await gate.once(lease=lease)
            except LeaseHeld as exc:
                print(f"nodegate gate --once: {exc}", file=sys.stderr)
                return 3
            print(report_json(report) if output == "json" else report_line(report))
            for error in report.errors:
                print(f"nodegate gate --once: {error}", file=sys.stderr)
            return 1 if report.errors else 0
        loop = asyncio.get_running_loop()
        task = loop.create_task(gate.run())
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task  # run() gives the Lease back when cancelled
        return 0
    finally:
        await kube.close()


def report_line(report: GateReport) -> str:
    held = ", ".join(f"{reason} {n}" for reason, n in sorted(report.held.items())) or "none"
    return f"{report.nodes} nodes: {report.released} released; held: {held}; {report.writes} writes"


def report_json(report: GateReport) -> str:
    """``--once -o json``: the pass as one object (field names stable)."""
    doc = {
        "nodes": report.nodes,
        "held": dict(sorted(report.held.items())),
        "released": report.released,
        "writes": report.writes,
        "errors": list(report.errors),
    }
    return json.dumps(doc, sort_keys=True)
