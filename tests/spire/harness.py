"""Real SPIRE for tests/spire: the binaries `make spire` caches, a server and agents on loopback.

Binaries: $NODEGATE_SPIRE_BIN, else ~/.cache/nodegate/spire/<version of tools/spire/go.mod>/.
Absent, the tests skip in one line, unless NODEGATE_REQUIRE_SPIRE=1 (CI), where that fails.
Every wait polls observable state (a socket, a CLI answer, a log line, a process exit) under a
bounded deadline.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV_BIN = "NODEGATE_SPIRE_BIN"
ENV_REQUIRE = "NODEGATE_REQUIRE_SPIRE"
T = TypeVar("T")


def version() -> str:
    text = (ROOT / "tools" / "spire" / "go.mod").read_text()
    found = re.search(r"^\s*github\.com/spiffe/spire (v\S+)", text, re.MULTILINE)
    assert found, "tools/spire/go.mod does not require github.com/spiffe/spire"
    return found.group(1)


def binaries() -> Path:
    """The folder with spire-server and spire-agent, or a skip (a failure under CI)."""
    folder = Path(os.environ.get(ENV_BIN) or Path.home() / ".cache" / "nodegate" / "spire" / version())
    if all((folder / name).is_file() for name in ("spire-server", "spire-agent")):
        return folder
    reason = f"SPIRE {version()} binaries not in {folder}: run `make spire`"
    if os.environ.get(ENV_REQUIRE) == "1":
        pytest.fail(f"{reason} ({ENV_REQUIRE}=1)")
    pytest.skip(reason, allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, probe: Callable[[], T | None], deadline_s: float = 60.0, every: float = 0.2) -> T:
    """Poll ``probe`` until it returns something other than None (bounded; a clear failure)."""
    deadline = time.monotonic() + deadline_s
    while True:
        got = probe()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {deadline_s:.0f}s waiting for {what}")
        time.sleep(every)  # polling interval of a bounded wait on observable state, not a sleep-for-effect


def _hcl(value: str) -> str:
    return json.dumps(value)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not ended within 15 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@dataclass
class Process:
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc)

    def exited(self) -> int | None:
        return self.proc.poll()


def _start(cmd: list[str], log: Path) -> Process:
    handle = log.open("ab")
    try:
        proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT)
    finally:
        handle.close()
    return Process(proc, log)


@dataclass
class Server:
    bin: Path
    dir: Path
    trust_domain: str
    port: int
    plugin_data_file: Path
    process: Process | None = None

    @property
    def socket(self) -> Path:
        return self.dir / "api.sock"

    @property
    def pid_file(self) -> Path:
        return self.dir / "server.pid"

    def config(self) -> Path:
        path = self.dir / "server.conf"
        path.write_text(
            f"""server {{
  bind_address = "127.0.0.1"
  bind_port = "{self.port}"
  socket_path = {_hcl(str(self.socket))}
  trust_domain = {_hcl(self.trust_domain)}
  data_dir = {_hcl(str(self.dir / "data"))}
  log_level = "DEBUG"
}}
plugins {{
  DataStore "sql" {{
    plugin_data {{
      database_type = "sqlite3"
      connection_string = {_hcl(str(self.dir / "data" / "datastore.sqlite3"))}
    }}
  }}
  KeyManager "memory" {{
    plugin_data {{}}
  }}
  NodeAttestor "x509pop" {{
    plugin_data_file = {_hcl(str(self.plugin_data_file))}
  }}
}}
"""
        )
        return path

    def start(self) -> None:
        self.process = _start(
            [str(self.bin / "spire-server"), "run", "-config", str(self.config())], self.dir / "server.log"
        )
        self.pid_file.write_text(f"{self.process.proc.pid}\n")
        wait_for("spire-server to be healthy", self._healthy, 120)

    def _healthy(self) -> bool | None:
        assert self.process is not None
        if self.process.exited() is not None:
            pytest.fail(f"spire-server exited:\n{self.process.text()[-3000:]}")
        ok = self.cli("healthcheck", check=False).returncode == 0
        return True if ok else None

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin / "spire-server"), args[0], *args[1:], "-socketPath", str(self.socket)]
        if len(args) > 1 and args[0] in ("agent", "entry", "bundle"):
            cmd = [
                str(self.bin / "spire-server"),
                args[0],
                args[1],
                "-socketPath",
                str(self.socket),
                *args[2:],
            ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        if check:
            assert proc.returncode == 0, f"{' '.join(args)}: {proc.stdout}{proc.stderr}"
        return proc

    def bundle_pem(self) -> str:
        return self.cli("bundle", "show").stdout

    def agent(self, agent_id: str) -> dict[str, Any] | None:
        """The attested agent (``agent show -output json``), or None when SPIRE has none."""
        proc = self.cli("agent", "show", "-spiffeID", agent_id, "-output", "json", check=False)
        if proc.returncode != 0:
            return None
        doc: dict[str, Any] = json.loads(proc.stdout)
        return doc

    def agents_of(self, node: str) -> list[dict[str, Any]]:
        """Every agent SPIRE knows for the node (its x509pop ``san:node`` selector), banned ones
        too, each with its ``spiffe_id`` added."""
        proc = self.cli(
            "agent", "list", "-selector", f"x509pop:san:node:{node}", "-output", "json", check=False
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        found: list[dict[str, Any]] = json.loads(proc.stdout or "{}").get("agents") or []
        for agent in found:
            agent["spiffe_id"] = f"spiffe://{agent['id']['trust_domain']}{agent['id']['path']}"
        return found

    def reconfigured(self) -> int:
        """How often the server has reconfigured a plugin from changed plugin data."""
        assert self.process is not None
        return self.process.text().count("Plugin reconfigured")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


@dataclass
class Agent:
    bin: Path
    dir: Path
    server: Server
    x509pop_file: Path
    process: Process | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.dir / "workload.sock"

    def config(self) -> Path:
        bundle = self.dir / "spire-bundle.pem"
        bundle.write_text(self.server.bundle_pem())
        path = self.dir / "agent.conf"
        pop = _hcl(str(self.x509pop_file))
        path.write_text(
            f"""agent {{
  data_dir = {_hcl(str(self.dir / "data"))}
  log_level = "DEBUG"
  server_address = "127.0.0.1"
  server_port = "{self.server.port}"
  socket_path = {_hcl(str(self.socket))}
  trust_bundle_path = {_hcl(str(bundle))}
  trust_domain = {_hcl(self.server.trust_domain)}
  # a refused attestation ends the agent at once (no retries for a minute): the tests wait for it
  retry_bootstrap = false
}}
plugins {{
  NodeAttestor "x509pop" {{
    plugin_data {{
      private_key_path = {pop}
      certificate_path = {pop}
    }}
  }}
  KeyManager "memory" {{
    plugin_data {{}}
  }}
  WorkloadAttestor "unix" {{
    plugin_data {{}}
  }}
}}
"""
        )
        return path

    def start(self) -> Process:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.process = _start(
            [str(self.bin / "spire-agent"), "run", "-config", str(self.config())], self.dir / "agent.log"
        )
        return self.process

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
