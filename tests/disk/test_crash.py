"""kill -9 of ``nodegate serve`` while nodes ask for their keys: nothing is lost (keys are derived,
never stored: the same key before and after), and a node whose boot fails its class never gets a
release, before, during or after the crash (no answer with keys, no release in its trail)."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bootstrap.node.disk.release import ReleaseOptions, release
from bootstrap.node.errors import JoinFailed, JoinGaveUp
from bootstrap.node.join import JoinOptions, join
from bootstrap.node.tpm import Agent
from bootstrap.store import open_store
from tests.disk import support as ds
from tests.support.swtpms import TpmInfo

pytestmark = pytest.mark.swtpm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    config: Path
    proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        port_file = self.config.parent / "port"
        port_file.unlink(missing_ok=True)
        with (self.config.parent / "serve.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bootstrap.cli", "serve", "--config", str(self.config),
                 "--port-file", str(port_file)],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while not port_file.exists():  # readiness: the server writes it once it listens
            assert self.proc.poll() is None, (self.config.parent / "serve.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the server did not start"
            await asyncio.sleep(0.05)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # SIGKILL: no cleanup, no flush
        self.proc.wait(10)
        self.proc = None


@dataclass
class Outcomes:
    keys: list[bytes] = field(default_factory=list)  # what the good node got
    refused: list[str] = field(default_factory=list)  # the bad node's codes
    bad_released: int = 0
    want: int = 3
    enough: asyncio.Event = field(default_factory=asyncio.Event)
    up: asyncio.Event = field(default_factory=asyncio.Event)  # the server listens


async def _loop(opts: ReleaseOptions, out: Outcomes, stop: asyncio.Event, *, good: bool) -> None:
    while not stop.is_set():
        try:
            got = await release(opts)
        except JoinGaveUp:
            await out.up.wait()  # the server is down: the node tries again once it is back
            continue
        except JoinFailed as exc:
            if good:
                raise
            out.refused.append(exc.code)
            continue
        if good:
            out.keys.append(got.key)
            if len(out.keys) >= out.want:
                out.enough.set()
        else:
            out.bad_released += 1


async def test_kill_9_during_releases_loses_nothing_and_releases_nothing_to_a_failed_node(
    tmp_path: Path, swtpm: TpmInfo, fresh_tpm: TpmInfo
) -> None:
    port = _free_port()
    config = ds.config_file(tmp_path, swtpm, listen=f"127.0.0.1:{port}")
    served = Served(config)
    await served.start()
    base = f"https://127.0.0.1:{port}"
    bundle = tmp_path / "server-ca.pem"
    bundle.write_bytes(b"".join(p.read_bytes() for p in sorted((tmp_path / "state" / "ca").glob("ca-*.pem"))))
    boot = ds.boot_id(tmp_path)
    for name, tpm in (("good", swtpm), ("bad", fresh_tpm)):
        await join(JoinOptions(server=base, ca_bundle=bundle, node_name=name, tcti=tpm.tcti,
                               out=tmp_path / name, boot_id_file=boot, attempts=1))  # fmt: skip
    with Agent(fresh_tpm.tcti) as agent:  # the bad node now runs a boot its class refuses
        agent.extend_pcr(4, hashlib.sha256(b"a kernel its class does not allow").digest())

    def opts(name: str, tpm: TpmInfo) -> ReleaseOptions:
        return ReleaseOptions(server=base, ca_bundle=bundle, node_name=name, volume=ds.VOLUME, tcti=tpm.tcti,
                              attempts=1, backoff=0.0, timeout=5.0, boot_id_file=boot)  # fmt: skip

    out, stop = Outcomes(), asyncio.Event()
    out.up.set()
    tasks = [
        asyncio.create_task(_loop(opts("good", swtpm), out, stop, good=True)),
        asyncio.create_task(_loop(opts("bad", fresh_tpm), out, stop, good=False)),
    ]
    try:
        await asyncio.wait_for(out.enough.wait(), 60)
        out.up.clear()
        served.kill9()  # mid-stream: both loops have requests in flight or about to be
        out.want = len(out.keys) + 3
        out.enough.clear()
        await served.start()
        out.up.set()
        await asyncio.wait_for(out.enough.wait(), 60)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if served.proc is not None:
            served.kill9()
    assert len(out.keys) >= out.want
    assert len(set(out.keys)) == 1  # the same key before and after the crash
    assert out.bad_released == 0
    assert out.refused
    assert set(out.refused) <= {"pcr_policy_violation"}
    store = await open_store("sqlite", state_dir=tmp_path / "state", kube=None)
    try:
        bad_trail = [e.action for e in await store.audit("bad", limit=1000)]
        good_trail = [e.action for e in await store.audit("good", limit=1000)]
    finally:
        await store.close()
    assert "disk-release" not in bad_trail
    assert "refused" in bad_trail
    assert good_trail.count("disk-release") >= len(out.keys)  # each answer it got was recorded first
