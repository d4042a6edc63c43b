"""``nodegate serve``: the service (join API, bundle, admin API, webhook and, with a cluster, the gate)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys

from bootstrap.cli.common import settings
from bootstrap.kube import KubeUnavailable
from bootstrap.logs import setup as logs
from bootstrap.service import app as server


def run(args: argparse.Namespace) -> int:
    config = settings(args.config, "nodegate serve")
    if config is None:
        return 2
    logs.configure(getattr(args, "log_level_value", logging.INFO))
    port_file, admission_port_file = args.port_file, args.admission_port_file

    def ready(port: int) -> None:  # both listeners are up
        # What exists once the listeners are up lives as long as the process: out of the
        # collector's way (start-up garbage collected first, so none of it is kept for good). A
        # full collection walked all of it (about 0.1 s measured under the admission benchmark),
        # stalling every review and join in flight.
        gc.collect()
        gc.freeze()
        if port_file is not None:
            server.write_port(port_file, port)

    def admission_ready(port: int) -> None:  # written before the join port: one file to wait for
        if admission_port_file is not None:
            server.write_port(admission_port_file, port)

    try:
        asyncio.run(
            server.serve(
                config,
                insecure_plaintext=args.insecure_plaintext,
                ready=ready,
                new_ca=args.new_ca,
                admission_ready=admission_ready,
            )
        )
    # every start failure is a ValueError (StartupError): one line naming the file and the fix
    except (ValueError, OSError, KubeUnavailable) as exc:
        print(f"nodegate serve: {exc}", file=sys.stderr)
        return 2
    return 0
