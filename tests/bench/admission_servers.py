"""The admission benchmark's server processes (``tests.bench.admission``): the TLS certificate,
starting ``nodegate serve`` or the bare app of ``tests.bench.admission_server``, waiting until
they listen, and stopping them."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.bench import admission_data, procstat
from tests.bench.admission_server import BARE_PARSERS, BARE_SERVERS
from tests.support import certs

SERVERS = ("webhook", "bare")
WEBHOOK, BARE = SERVERS
START_SECONDS = 30.0  # deadline for a server to write its port file
ROOT = Path(__file__).resolve().parents[2]


def make_tls(workdir: Path) -> tuple[Path, Path, ssl.SSLContext]:
    """A self-signed P-256 certificate for 127.0.0.1; its files and a client context trusting it."""
    cert_file, key_file, _ = certs.loopback_tls(workdir, "nodegate-bench.nodegate.svc", dns=("localhost",))
    client = ssl.create_default_context(cafile=str(cert_file))
    client.minimum_version = ssl.TLSVersion.TLSv1_2
    return cert_file, key_file, client


@dataclass
class Server:
    mode: str
    proc: subprocess.Popen[bytes]
    log: Path
    port_file: Path
    profile: Path | None
    port: int = 0
    path: str = admission_data.PATH  # the route under load
    admission_port_file: Path | None = None  # nodegate serve: the webhooks' own listener

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}{self.path}"

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of the server process so far (Linux /proc), None elsewhere."""
        return procstat.pid_cpu_seconds(self.proc.pid)

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""


def serve_config(workdir: Path, cert: Path, key: Path) -> dict[str, Any]:
    """``nodegate serve`` as the chart runs it, with the benchmark's policies and RBAC as files
    (offline RBAC: no cluster) and the bench certificate on both listeners."""
    policy_file, rbac_file = workdir / "policies.yaml", workdir / "rbac.yaml"
    policy_file.write_text(yaml.safe_dump_all(admission_data.POLICY_DOCS))
    rbac_file.write_text(yaml.safe_dump_all(admission_data.RBAC))
    return {
        "trust_domain": "bench.nodegate.test",
        "listen": "127.0.0.1:0",
        "state_dir": str(workdir / "state"),
        "store": "sqlite",
        "server_names": ["localhost", "127.0.0.1"],
        "tls": {"cert_file": str(cert), "key_file": str(key)},
        "admission": {
            "listen": "127.0.0.1:0",
            "policy_files": [str(policy_file)],
            "rbac_files": [str(rbac_file)],
            "owner": admission_data.OWNER,
        },
    }


def start_server(
    mode: str,
    cert: Path,
    key: Path,
    workdir: Path,
    profile_dir: Path | None,
    cpus: set[int],
    bare_parser: str = BARE_PARSERS[0],
    webhook: str = "serve",
    log_level: str = "info",
    bare_server: str = BARE_SERVERS[0],
) -> Server:
    port_file, log = workdir / f"{mode}.port", workdir / f"{mode}.log"
    if mode == WEBHOOK and webhook == "serve":
        return _start_serve(cert, key, workdir, profile_dir, cpus, log_level)
    profile = profile_dir / f"admission-{mode}.prof" if profile_dir else None
    cmd = [sys.executable, "-m", "tests.bench.admission_server", "--mode", mode]
    cmd += [
        "--cert",
        str(cert),
        "--key",
        str(key),
        "--port-file",
        str(port_file),
        "--bare-parser",
        bare_parser,
        "--bare-server",
        bare_server,
    ]
    if profile is not None:
        cmd += ["--profile", str(profile)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(proc.pid, cpus)  # before it starts threads: they inherit it
    return Server(mode, proc, log, port_file, profile)


def _start_serve(
    cert: Path, key: Path, workdir: Path, profile_dir: Path | None, cpus: set[int], log_level: str = "info"
) -> Server:
    """``python -m bootstrap.cli serve`` (``nodegate serve``), its JSON log (level info, the
    default) written to a file as a container runtime would collect it."""
    home = workdir / "serve"
    home.mkdir()
    config = home / "config.yaml"
    config.write_text(yaml.safe_dump(serve_config(home, cert, key), sort_keys=False))
    port_file, admission_port_file, log = home / "port", home / "admission-port", workdir / "webhook.log"
    profile = profile_dir / "admission-webhook.prof" if profile_dir else None
    cmd = [sys.executable]
    if profile is not None:
        cmd += ["-m", "cProfile", "-o", str(profile)]
    cmd += ["-m", "bootstrap.cli", "serve", "--config", str(config), "--port-file", str(port_file)]
    cmd += ["--admission-port-file", str(admission_port_file), "--log-level", log_level]
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODEGATE_LOG_LEVEL")}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(proc.pid, cpus)  # before it starts threads: they inherit it
    return Server(WEBHOOK, proc, log, port_file, profile, admission_port_file=admission_port_file)


def wait_listening(servers: list[Server]) -> None:
    deadline = time.monotonic() + START_SECONDS
    for server in servers:
        while not server.port_file.exists():
            if server.proc.poll() is not None:
                raise RuntimeError(
                    f"{server.mode} server exited with {server.proc.returncode}:\n{server.tail()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{server.mode} server did not listen within {START_SECONDS:.0f} s")
            time.sleep(0.02)
        ports = server.admission_port_file or server.port_file  # serve writes this one first
        server.port = int(ports.read_text())


def stop_servers(servers: list[Server]) -> None:
    for server in servers:
        if server.proc.poll() is None:
            server.proc.terminate()
    for server in servers:
        try:
            server.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
