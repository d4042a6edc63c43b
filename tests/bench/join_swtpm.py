"""The join benchmark's swtpm check (``tests.bench.join``): one real ``nodegate join`` from a
manufactured swtpm against the chain variant's server, when swtpm is installed."""

from __future__ import annotations

import datetime as dt
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from attest import svid
from tests.bench.join_servers import Server, service_ca


@dataclass
class SwtpmSetup:
    roots_file: Path | None
    stop: Any  # callable stopping the swtpm, or None
    tcti: str
    note: str


def setup_swtpm(workdir: Path) -> SwtpmSetup:
    """A manufactured swtpm and a PEM file with its local CA (root + intermediate)."""
    from bootstrap.demo import swtpm

    try:
        local = swtpm.make_ca(workdir / "xdg")
        swtpm.manufacture(local, workdir / "tpm")
        running = swtpm.start(local, workdir / "tpm")
    except (swtpm.SwtpmMissing, subprocess.CalledProcessError, RuntimeError, OSError) as exc:
        return SwtpmSetup(None, None, "", f"swtpm unavailable: {str(exc)[:200]}")
    pem = workdir / "swtpm-localca.pem"
    pem.write_bytes(
        local.root.public_bytes(serialization.Encoding.PEM)
        + local.intermediate.public_bytes(serialization.Encoding.PEM)
    )
    return SwtpmSetup(pem, running.stop, running.tcti, "")


async def swtpm_join(server: Server, setup: SwtpmSetup) -> dict[str, Any]:
    """One real ``nodegate join`` from the swtpm against the benchmark's chain server."""
    if setup.roots_file is None:
        return {"ok": None, "note": setup.note}
    from bootstrap.node import join as joinclient

    bundle = server.workdir / "service-bundle.pem"
    bundle.write_bytes(svid.bundle_pem(service_ca(server).roots(dt.datetime.now(dt.UTC))))
    opts = joinclient.JoinOptions(
        server=server.base,
        ca_bundle=bundle,
        node_name="swtpm-node",
        tcti=setup.tcti,
        out=server.workdir / "swtpm-node",
        ek_kind="rsa",
        attempts=1,
    )
    started = time.perf_counter()
    try:
        joined = await joinclient.join(opts)
    except joinclient.JoinFailed as exc:
        return {"ok": False, "note": f"refused: {exc.code}: {exc.detail}"}
    took = time.perf_counter() - started
    return {"ok": True, "spiffe_id": joined.spiffe_id, "seconds": round(took, 2), "note": "RSA-2048 EK"}
