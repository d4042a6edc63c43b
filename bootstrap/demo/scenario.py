"""`nodegate demo`: the whole story on one machine in well under a minute.

Real: the join service (`nodegate serve`, a subprocess on TLS with its own CA), `nodegate join`
(one subprocess per node), the attestation code, the hold gate (the `nodegate gate --once` pass)
and the admission webhook (the running service's, with a PackagePolicy and RBAC files: the same
decisions `nodegate policy test` makes). Emulated, and labelled so in the output: the TPMs
(swtpm, with swtpm_localca as the TPM vendor's CA), the Kubernetes API (kmock with
bootstrap/demo/emulator.py, in this process on loopback, with a stand-in for the cluster's kubelet
client signer) and NodeWright's agent (the demo writes the package states it would write).

The steps are in :mod:`bootstrap.demo.story`; this module runs them within a time limit, cleans
up, and prints the summary line (or the one-line failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import tempfile
import time
from pathlib import Path

from bootstrap.demo.manifests import NODES
from bootstrap.demo.narration import STEPS, DemoFailed, step

_KMOCK_MISSING = (
    "the emulated Kubernetes API needs kmock, the extra nodegate[demo]: "
    "run `make demo` (or pip install -e '.[demo]')"
)
try:
    from bootstrap.demo.story import Demo, Summary
except ImportError as exc:  # kmock is optional: without it the demo fails in one line, not a traceback
    if not (exc.name or "").startswith("kmock"):
        raise
    _kmock_found = False
else:
    _kmock_found = True

TOTAL_TIMEOUT = 120.0


async def _main(root: Path) -> Summary:
    task = asyncio.current_task()
    if task is not None:  # SIGTERM: stop as for Ctrl-C, cleaning up processes and files
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    async with contextlib.AsyncExitStack() as stack:
        try:
            async with asyncio.timeout(TOTAL_TIMEOUT):
                summary = await Demo(root, stack).run()
        except TimeoutError:
            raise DemoFailed(f"the demo took longer than {TOTAL_TIMEOUT:.0f} s") from None
        step(
            STEPS, f"cleaning up: nodegate serve, {len(NODES) + 1} swtpm processes, the emulated API, {root}"
        )
    return summary


def run() -> int:
    if not _kmock_found:
        print(f"nodegate demo: failed: {_KMOCK_MISSING}", file=sys.stderr)
        return 1
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="nodegate-demo-") as tmp:
            summary = asyncio.run(_main(Path(tmp)))
    except DemoFailed as exc:
        print(f"nodegate demo: failed: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("nodegate demo: interrupted; its processes and files are cleaned up", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001  (one line, never a traceback)
        print(f"nodegate demo: failed: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
        return 1
    print(
        f"demo complete in {time.monotonic() - started:.1f} s: {len(summary.spiffe_ids)} nodes attested, "
        f"1 refused ({summary.refused}), {len(summary.released)} released, {len(summary.held)} held "
        f"({', '.join(summary.held.values())}), 1 rebooted and re-attested ({summary.rebooted}), "
        f"webhook {summary.allowed} allowed / {summary.denied} denied, "
        f"the sample CR given {len(summary.tolerations)} hold tolerations reached and released "
        f"{summary.sample_released}",
        flush=True,
    )
    return 0
