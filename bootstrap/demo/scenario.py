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
import threading
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


async def _main(root: Path, interrupted: threading.Event | None = None) -> Summary:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:  # SIGTERM: stop as for Ctrl-C, cleaning up processes and files
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGTERM, task.cancel)

    def on_sigint(_signum: int, _frame: object) -> None:
        # Remembered at once: a step may fail (a child gone, a refused connection) before the
        # cancellation reaches it, and that failure is then reported as the interruption it is.
        if interrupted is not None:
            interrupted.set()
        if task is not None:
            loop.call_soon_threadsafe(task.cancel)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        return await _steps(root)
    finally:
        signal.signal(signal.SIGINT, previous)


async def _steps(root: Path) -> Summary:
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


def _interrupted() -> int:
    print("nodegate demo: interrupted; its processes and files are cleaned up", file=sys.stderr)
    return 130


def run() -> int:
    if not _kmock_found:
        print(f"nodegate demo: failed: {_KMOCK_MISSING}", file=sys.stderr)
        return 1
    started = time.monotonic()
    interrupted = threading.Event()
    try:
        with tempfile.TemporaryDirectory(prefix="nodegate-demo-") as tmp:
            summary = asyncio.run(_main(Path(tmp), interrupted))
    except (KeyboardInterrupt, asyncio.CancelledError):
        return _interrupted()
    except DemoFailed as exc:
        if interrupted.is_set():
            return _interrupted()
        print(f"nodegate demo: failed: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001  (one line, never a traceback)
        if interrupted.is_set():
            return _interrupted()
        print(f"nodegate demo: failed: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
        return 1
    # the counts of the steps as they were shown: the gate's first release (step 7) held one node
    # that the sample CR released later (step 10); the webhook allowed a CR in steps 6, 9 and 10
    print(
        f"demo complete in {time.monotonic() - started:.1f} s: {len(summary.spiffe_ids)} nodes attested, "
        f"1 refused ({summary.refused}), gate released {len(summary.released)} and held "
        f"{len(summary.held)} ({', '.join(summary.held.values())}), 1 rebooted and re-attested "
        f"({summary.rebooted}), webhook allowed {summary.allowed} CRs (steps 6, 9, 10) and denied "
        f"{summary.denied} (step 9), the sample CR given {len(summary.tolerations)} hold tolerations "
        f"reached and released {summary.sample_released}: "
        f"{len(summary.released) + 1} of {len(summary.spiffe_ids)} nodes released",
        flush=True,
    )
    return 0
