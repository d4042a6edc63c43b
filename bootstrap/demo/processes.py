"""The demo's real processes: `nodegate serve` and `nodegate join` as subprocesses, and blocking
work (swtpm_setup, TPM commands) off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bootstrap.demo import swtpm
from bootstrap.demo.narration import DemoFailed

START_TIMEOUT = 30.0
JOIN_TIMEOUT = 60.0


def _env() -> dict[str, str]:
    return {**os.environ, "TSS2_LOG": os.environ.get("TSS2_LOG", "all+none")}


def _nodegate(*args: str) -> tuple[str, ...]:
    # The interpreter running the demo, so a venv's nodegate is used even when it is not on PATH.
    return (sys.executable, "-m", "bootstrap.cli", *args)


async def to_thread(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Blocking work (swtpm_setup, TPM commands) off the event loop. When the demo is stopped
    meanwhile, the work still finishes before the cleanup deletes the files it uses."""
    work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await work
        raise
    except (swtpm.SwtpmMissing, RuntimeError, OSError) as exc:
        raise DemoFailed(f"{what}: {exc}") from None


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


async def start_serve(stack: contextlib.AsyncExitStack, config: Path, root: Path) -> tuple[str, str]:
    """The real `nodegate serve` with ``config``, stopped by ``stack``; its https URLs (join API,
    admission listener) once it listens."""
    port_file, log = root / "serve.port", root / "serve.log"
    admission_port_file = root / "serve.admission-port"
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *_nodegate(
                "serve",
                *("--config", str(config), "--port-file", str(port_file)),
                *("--admission-port-file", str(admission_port_file)),
            ),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=err,
            env=_env(),
            start_new_session=True,  # Ctrl-C reaches the demo, which stops it in order
        )
    stack.push_async_callback(_stop, proc)
    deadline = time.monotonic() + START_TIMEOUT
    while not port_file.exists():  # serve writes it (atomically) once it listens
        if proc.returncode is not None:
            raise DemoFailed(f"nodegate serve exited ({proc.returncode}): {_last_line(log)}")
        if time.monotonic() > deadline:
            raise DemoFailed(f"nodegate serve did not listen within {START_TIMEOUT:.0f} s: {_last_line(log)}")
        await asyncio.sleep(0.05)
    # the admission port file is written first
    return (
        f"https://127.0.0.1:{int(port_file.read_text())}",
        f"https://127.0.0.1:{int(admission_port_file.read_text())}",
    )


@dataclass
class Joined:
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Machine:
    """What one emulated machine's boot gives its node agent: its TPM, the kernel's boot id (a
    file per machine: they share one kernel here) and the firmware's event log."""

    name: str
    tpm: swtpm.Swtpm
    boot_id_file: Path
    event_log: Path


async def run_join(machine: Machine, server: str, bundle: Path, out: Path) -> Joined:
    """The real `nodegate join` for one node, as its boot script would run it."""
    return await _run_node(
        f"nodegate join of {machine.name}",
        "join",
        *("--server", server, "--ca-bundle", str(bundle), "--node-name", machine.name),
        *_machine_args(machine),
        *("--out", str(out)),
    )


async def run_attest(machine: Machine, server: str, bundle: Path, node_dir: Path) -> Joined:
    """The real `nodegate attest` for one node, as its systemd unit runs it at every boot."""
    return await _run_node(
        f"nodegate attest of {machine.name}",
        "attest",
        *("--server", server, "--ca-bundle", str(bundle), "--dir", str(node_dir)),
        *_machine_args(machine),
    )


async def run_nodegate(what: str, *args: str) -> Joined:
    """Any other `nodegate` command, as an operator runs it (``what`` names it in a failure)."""
    return await _run_node(what, *args)


def _machine_args(machine: Machine) -> tuple[str, ...]:
    return (
        *("--tcti", machine.tpm.tcti, "--attempts", "3"),
        *("--event-log", str(machine.event_log), "--boot-id-file", str(machine.boot_id_file)),
    )


async def _run_node(what: str, *args: str) -> Joined:
    proc = await asyncio.create_subprocess_exec(
        *_nodegate(*args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(),
        start_new_session=True,  # Ctrl-C reaches the demo, which stops it in order
    )
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), JOIN_TIMEOUT)
    except TimeoutError:
        raise DemoFailed(f"{what} did not finish within {JOIN_TIMEOUT:.0f} s") from None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return Joined(proc.returncode or 0, stdout.decode(errors="replace"), stderr.decode(errors="replace"))
