"""`nodegate renew` against the real service in-process (real TLS, mTLS with the node's SVID),
with a swtpm: the AK the join registered is recreated by the renewal, so the quote verifies
against the join's record. The node's folder is written by the real `nodegate join` client."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import stat
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from attest import svid
from bootstrap import files
from bootstrap.cli import arguments
from bootstrap.cli import node as node_cli
from bootstrap.config import Settings, settings_from_obj
from bootstrap.node import join as joinclient
from bootstrap.node.join import JoinFailed, JoinGaveUp, JoinOptions, JoinUsageError
from bootstrap.node.renew import RenewOptions, renew
from tests.support.service import Running, running
from tests.support.swtpms import TpmInfo

pytestmark = pytest.mark.swtpm

NODE = "renew-1"
CRED_FILES = ("node.key", "svid.pem", "bundle.pem", "join.json")


class Sleeps:
    """The injected sleep: records the delays, never waits."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


@pytest.fixture
def settings(tmp_path: Path, swtpm: TpmInfo) -> Settings:
    roots = tmp_path / "ek-roots.pem"
    roots.write_bytes(
        b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (swtpm.root, swtpm.intermediate))
    )
    return settings_from_obj(
        {
            "trust_domain": "fleet.test",
            "listen": "127.0.0.1:0",
            "state_dir": str(tmp_path / "state"),
            "ek_roots": [str(roots)],
            "server_names": ["localhost", "127.0.0.1"],
        }
    )


@pytest.fixture
async def svc(settings: Settings) -> AsyncIterator[Running]:
    async with running(settings) as r:
        yield r


def ca_bundle(r: Running, tmp: Path) -> Path:
    """What the operator puts on the node: the service's CA certificates (its TLS chains to them)."""
    path = tmp / "server-ca.pem"
    path.write_bytes(svid.bundle_pem(r.service.cas.roots(datetime.now(UTC))))
    return path


async def joined(r: Running, swtpm: TpmInfo, tmp: Path) -> Path:
    tmp.mkdir(exist_ok=True)
    out = tmp / "node"
    opts = JoinOptions(server=r.base, ca_bundle=ca_bundle(r, tmp), node_name=NODE, tcti=swtpm.tcti, out=out)
    await joinclient.join(opts, sleep=Sleeps())
    return out


def ropts(r: Running | str, swtpm: TpmInfo, tmp: Path, **kw: Any) -> RenewOptions:
    base: dict[str, Any] = {
        "server": r if isinstance(r, str) else r.base,
        "ca_bundle": tmp / "server-ca.pem",
        "dir": tmp / "node",
        "tcti": swtpm.tcti,
    }
    return RenewOptions(**(base | kw))


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def leaf_of(folder: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificates((folder / "svid.pem").read_bytes())[0]


def key_matches(folder: Path) -> bool:
    key = serialization.load_pem_private_key((folder / "node.key").read_bytes(), None)
    return bool(leaf_of(folder).public_key() == key.public_key())


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"https://127.0.0.1:{s.getsockname()[1]}"


def args(argv: list[str]) -> argparse.Namespace:
    return arguments.parser().parse_args(["renew", *argv])


def argv(server: str, swtpm: TpmInfo, tmp: Path, *extra: str) -> list[str]:
    return [
        *("--server", server, "--ca-bundle", str(tmp / "server-ca.pem")),
        *("--dir", str(tmp / "node"), "--tcti", swtpm.tcti, *extra),
    ]


# -- success ---------------------------------------------------------------------------------------


async def test_renewal_replaces_key_and_svid_atomically(svc: Running, swtpm: TpmInfo, tmp_path: Path) -> None:
    out = await joined(svc, swtpm, tmp_path)
    before = snapshot(out)
    old_leaf = leaf_of(out)
    with (out / "svid.pem").open("rb") as old_svid, (out / "node.key").open("rb") as old_key:
        result = await renew(ropts(svc, swtpm, tmp_path, before=timedelta(hours=2)), sleep=Sleeps())
        # Replaced by rename, never rewritten in place: a reader holding the old files reads them whole.
        assert old_svid.read() == before["svid.pem"]
        assert old_key.read() == before["node.key"]
    assert result.renewed
    assert set(result.files) == set(CRED_FILES)
    assert sorted(p.name for p in out.iterdir()) == sorted(CRED_FILES)  # no temp or pending files
    for name in CRED_FILES:
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    after = snapshot(out)
    assert after["node.key"] != before["node.key"]  # a fresh key
    assert after["svid.pem"] != before["svid.pem"]
    assert key_matches(out)
    new_leaf = leaf_of(out)
    assert new_leaf.serial_number != old_leaf.serial_number
    san = new_leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [f"spiffe://fleet.test/node/{NODE}"]
    assert result.spiffe_id == f"spiffe://fleet.test/node/{NODE}"
    assert result.svid_expires_at == new_leaf.not_valid_after_utc
    index = json.loads((out / "join.json").read_text())
    assert index["node_name"] == NODE
    assert datetime.fromisoformat(index["svid_expires_at"]) == new_leaf.not_valid_after_utc
    record = await svc.service.store.get(NODE)
    assert record is not None
    assert record.svid_serials[-1] == f"{new_leaf.serial_number:x}"
    assert record.expires_at == new_leaf.not_valid_after_utc  # the attestation lives on
    assert [a.action for a in await svc.service.store.audit(NODE)][:2] == ["renew", "join"]

    # The new pair authenticates the next renewal.
    again = await renew(ropts(svc, swtpm, tmp_path, before=timedelta(hours=2)), sleep=Sleeps())
    assert again.renewed
    assert key_matches(out)
    assert [a.action for a in await svc.service.store.audit(NODE)][:3] == ["renew", "renew", "join"]


async def test_fresh_svid_is_left_alone(
    svc: Running, swtpm: TpmInfo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = await joined(svc, swtpm, tmp_path)
    before = snapshot(out)
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    # Neither the server nor the TPM is needed to decide that: both point nowhere here.
    rc = await asyncio.to_thread(
        node_cli.renew_main,
        args(argv(dead_url(), swtpm, tmp_path, "--tcti", "swtpm:host=127.0.0.1,port=1")),
    )
    captured = capsys.readouterr()
    assert rc == 0
    assert captured.err == ""
    lines = captured.out.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"nodegate renew: SVID for spiffe://fleet.test/node/{NODE} valid until ")
    assert lines[0].endswith("; nothing to do")
    assert snapshot(out) == before
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes
    assert [a.action for a in await svc.service.store.audit(NODE)] == ["join"]


async def test_default_threshold_is_a_third_of_the_lifetime(
    svc: Running, swtpm: TpmInfo, tmp_path: Path
) -> None:
    out = await joined(svc, swtpm, tmp_path)
    leaf = leaf_of(out)
    third = (leaf.not_valid_after_utc - leaf.not_valid_before_utc) / 3
    edge = leaf.not_valid_after_utc - third
    early = await renew(ropts(svc, swtpm, tmp_path), now=lambda: edge - timedelta(seconds=1))
    assert not early.renewed
    assert early.before == third
    late = await renew(ropts(svc, swtpm, tmp_path), now=lambda: edge + timedelta(seconds=1))
    assert late.renewed
    assert leaf_of(out).serial_number != leaf.serial_number


# -- refusals and failures -------------------------------------------------------------------------


async def test_revoked_node_gets_one_line_and_exit_1(
    svc: Running, swtpm: TpmInfo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = await joined(svc, swtpm, tmp_path)
    before = snapshot(out)
    await svc.service.store.revoke(NODE, actor="test", reason="RMA")
    rc = await asyncio.to_thread(node_cli.renew_main, args(argv(svc.base, swtpm, tmp_path, "--before", "2h")))
    captured = capsys.readouterr()
    assert rc == 1
    assert captured.err.splitlines() == [
        f"nodegate renew: refused (node_revoked, HTTP 403): node {NODE} is revoked"
    ]
    assert captured.out == ""
    assert snapshot(out) == before


async def test_outage_exits_75_and_the_old_svid_keeps_working(
    settings: Settings, swtpm: TpmInfo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running(settings) as r:
        out = await joined(r, swtpm, tmp_path)
        down = r.base  # nothing listens there once the service stopped
    before = snapshot(out)

    sleeps = Sleeps()
    with pytest.raises(JoinGaveUp) as exc:
        await renew(ropts(down, swtpm, tmp_path, before=timedelta(hours=2), attempts=3), sleep=sleeps)
    assert exc.value.code == "server_unreachable"
    assert "3 attempts" in str(exc.value)
    assert len(sleeps.delays) == 2

    rc = await asyncio.to_thread(
        node_cli.renew_main, args(argv(down, swtpm, tmp_path, "--before", "2h", "--attempts", "1"))
    )
    err = capsys.readouterr().err.splitlines()
    assert rc == 75
    assert len(err) == 1
    assert err[0].startswith("nodegate renew: gave up (server_unreachable): /v1/nodes/self/renew: ")
    assert snapshot(out) == before  # nothing half-written, no pending key

    # The service comes back on the same state: the untouched SVID still authenticates.
    async with running(settings) as r:
        result = await renew(ropts(r, swtpm, tmp_path, before=timedelta(hours=2)), sleep=Sleeps())
    assert result.renewed
    assert key_matches(out)


async def test_crash_between_svid_and_key_is_completed_by_the_next_run(
    svc: Running, swtpm: TpmInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = await joined(svc, swtpm, tmp_path)
    old = snapshot(out)
    real = files.write_atomic

    def fail_on_key(path: Path, data: bytes, mode: int = 0o600) -> None:
        if path.name == "node.key":
            raise OSError(28, "No space left on device")
        real(path, data, mode)

    monkeypatch.setattr("bootstrap.node.credentials.write_atomic", fail_on_key)
    with pytest.raises(JoinFailed) as exc:
        await renew(ropts(svc, swtpm, tmp_path, before=timedelta(hours=2)), sleep=Sleeps())
    monkeypatch.undo()
    assert exc.value.code == "file_error"
    assert joinclient.exit_status(exc.value) == 2
    # The torn state a power cut could leave: the new SVID, the old key, the new key pending.
    assert (out / "svid.pem").read_bytes() != old["svid.pem"]
    assert (out / "node.key").read_bytes() == old["node.key"]
    assert (out / "node.key.next").exists()
    assert not key_matches(out)

    # The next run (here: with nothing due) finishes the swap before anything else.
    result = await renew(ropts(svc, swtpm, tmp_path), sleep=Sleeps())
    assert not result.renewed
    assert key_matches(out)
    assert not (out / "node.key.next").exists()
    assert stat.S_IMODE((out / "node.key").stat().st_mode) == 0o600
    # ... and the completed pair authenticates.
    assert (await renew(ropts(svc, swtpm, tmp_path, before=timedelta(hours=2)), sleep=Sleeps())).renewed


async def test_failure_before_the_svid_leaves_the_old_pair(
    svc: Running, swtpm: TpmInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = await joined(svc, swtpm, tmp_path)
    old = snapshot(out)
    real = files.write_atomic

    def fail_on_svid(path: Path, data: bytes, mode: int = 0o600) -> None:
        if path.name == "svid.pem":
            raise OSError(30, "Read-only file system")
        real(path, data, mode)

    monkeypatch.setattr("bootstrap.node.credentials.write_atomic", fail_on_svid)
    with pytest.raises(JoinFailed):
        await renew(ropts(svc, swtpm, tmp_path, before=timedelta(hours=2)), sleep=Sleeps())
    monkeypatch.undo()
    assert (out / "svid.pem").read_bytes() == old["svid.pem"]
    assert (out / "node.key").read_bytes() == old["node.key"]
    result = await renew(ropts(svc, swtpm, tmp_path), sleep=Sleeps())  # not due: only tidies up
    assert not result.renewed
    assert sorted(p.name for p in out.iterdir()) == sorted(CRED_FILES)  # the stale pending key is gone
    assert (await renew(ropts(svc, swtpm, tmp_path, before=timedelta(hours=2)), sleep=Sleeps())).renewed


async def test_expired_svid_asks_for_a_join(svc: Running, swtpm: TpmInfo, tmp_path: Path) -> None:
    out = await joined(svc, swtpm, tmp_path)
    later = leaf_of(out).not_valid_after_utc + timedelta(seconds=1)
    with pytest.raises(JoinFailed) as exc:
        await renew(ropts(svc, swtpm, tmp_path), now=lambda: later)
    assert exc.value.code == "svid_expired"
    assert "run nodegate join" in str(exc.value)
    assert joinclient.exit_status(exc.value) == 2


async def test_svid_for_another_key_is_refused_locally(svc: Running, swtpm: TpmInfo, tmp_path: Path) -> None:
    out = await joined(svc, swtpm, tmp_path)
    other = await joined(svc, swtpm, tmp_path / "second")  # same TPM and name, another join: another key
    (out / "node.key").write_bytes((other / "node.key").read_bytes())
    with pytest.raises(JoinFailed) as exc:
        await renew(ropts(svc, swtpm, tmp_path, before=timedelta(hours=2)), sleep=Sleeps())
    assert exc.value.code == "credentials_invalid"
    assert "does not certify" in str(exc.value)


def test_not_joined_and_usage(tmp_path: Path, swtpm: TpmInfo, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "node").mkdir()
    (tmp_path / "server-ca.pem").write_bytes(b"")
    rc = node_cli.renew_main(args(argv("https://127.0.0.1:1", swtpm, tmp_path)))
    assert rc == 2
    assert capsys.readouterr().err.splitlines() == [
        f"nodegate renew: failed (not_joined): {tmp_path / 'node' / 'join.json'} does not exist: "
        "run nodegate join first"
    ]
    rc = node_cli.renew_main(args(argv("http://127.0.0.1:1", swtpm, tmp_path)))
    assert rc == 2
    assert "must be https://" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        args(argv("https://127.0.0.1:1", swtpm, tmp_path, "--before", "soon"))
    with pytest.raises(JoinUsageError, match="before"):
        RenewOptions("https://127.0.0.1", Path("ca.pem"), before=timedelta(0))
    assert args(argv("https://x", swtpm, tmp_path, "--before", "20m")).before == timedelta(minutes=20)
