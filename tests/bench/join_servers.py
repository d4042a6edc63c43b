"""The join benchmark's server (``tests.bench.join``): ``nodegate serve`` with the benchmark's
config in its own process on its own CPU, its CA and the client's TLS context, and its CPU
time and RSS from /proc."""

from __future__ import annotations

import datetime as dt
import os
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from attest import ca, svid
from bootstrap.config import Settings, settings_from_obj
from bootstrap.service.pki.authority import CaStore
from tests.bench import common, procstat

VARIANTS = ("chain", "allowlist")
CHAIN, ALLOWLIST = VARIANTS
TRUST_DOMAIN = "bench.nodegate.test"
SELECTION = "sha256:0,1,2,3,4,5,6,7"  # the service's default pcr_policy selection (checked below)
START_SECONDS = 60.0
ROOT = Path(__file__).resolve().parents[2]


def bench_cpus() -> tuple[set[int], set[int], set[int]]:
    """(all usable, server, client) CPUs: the server gets the first, the client the rest."""
    return (common.usable_cpus(), *common.split_cpus())


@dataclass
class Server:
    variant: str
    workdir: Path
    settings: Settings
    proc: subprocess.Popen[bytes]
    log: Path
    port_file: Path
    profile: Path | None
    port: int = 0
    admission_port: int = 0  # the webhooks' own listener (admission.listen)

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def admission_base(self) -> str:
        return f"https://127.0.0.1:{self.admission_port}"

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of the server process (all threads) so far; None off Linux."""
        return procstat.pid_cpu_seconds(self.proc.pid)

    def rss_kib(self) -> int | None:
        return procstat.rss_kib(self.proc.pid)

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""


def server_config(workdir: Path, variant: str, ek_roots: list[Path], allowlist: list[str]) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "trust_domain": TRUST_DOMAIN,
        "listen": "127.0.0.1:0",
        "admission": {"listen": "127.0.0.1:0"},
        "state_dir": str(workdir / "state"),
        "store": "sqlite",
        "server_names": ["localhost", "127.0.0.1"],
        # Every request comes from 127.0.0.1: the per-address limiter would otherwise be measured.
        "limits": {"join_rate": 1e6, "join_burst": 1_000_000},
    }
    if variant == CHAIN:
        doc["ek_roots"] = [str(p) for p in ek_roots]
    else:
        doc["ek_allowlist"] = allowlist
    return doc


def start_server(
    variant: str, workdir: Path, doc: dict[str, Any], cpus: set[int], profile_dir: Path | None
) -> Server:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    settings = settings_from_obj(doc)
    if settings.pcr_policy.selection != SELECTION:
        raise RuntimeError(f"the service quotes {settings.pcr_policy.selection}, the floor {SELECTION}")
    port_file, log = workdir / "port", workdir / "server.log"
    profile = profile_dir / f"join-{variant}.prof" if profile_dir else None
    cmd = [sys.executable]
    if profile is not None:
        cmd += ["-m", "cProfile", "-o", str(profile)]
    admission_port_file = workdir / "admission-port"  # written before the port file
    cmd += ["-m", "bootstrap.cli", "serve", "--config", str(config), "--port-file", str(port_file)]
    cmd += ["--admission-port-file", str(admission_port_file)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(proc.pid, cpus)  # before it starts threads: they inherit it
    server = Server(variant, workdir, settings, proc, log, port_file, profile)
    deadline = time.monotonic() + START_SECONDS
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{variant} server exited with {proc.returncode}:\n{server.tail()}")
        if time.monotonic() > deadline:
            stop_server(server)
            raise RuntimeError(f"{variant} server did not listen within {START_SECONDS:.0f} s")
        time.sleep(0.02)
    server.port = int(port_file.read_text())
    server.admission_port = int(admission_port_file.read_text())
    return server


def stop_server(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.terminate()
    try:
        server.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


def service_ca(server: Server) -> ca.CaSet:
    """The CA the server created in its state_dir: its roots for TLS, its signer for the floor."""
    return CaStore(server.settings.state_dir / "ca", TRUST_DOMAIN).load()


def client_tls(cas: ca.CaSet) -> ssl.SSLContext:
    roots = svid.bundle_pem(cas.roots(dt.datetime.now(dt.UTC))).decode()
    ctx = ssl.create_default_context(cadata=roots)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx
