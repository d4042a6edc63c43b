"""bootstrap/store/backup/: one encrypted archive of the CA keys, the session keys and the store.

The central test is the issue's: back up a running service after a real join, restore into a
fresh state_dir, start the restored service, and see it accept the node's old SVID and refuse a
replay of the finished session. The rest are the ways an archive or a target can be wrong, each
refused with its code and with nothing written.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import os
import sqlite3
import stat
import struct
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attest import svid
from attest.tpm import Counters
from bootstrap.cli import arguments
from bootstrap.cli import backup as backup_cli
from bootstrap.config import Settings
from bootstrap.service.app import build_service
from bootstrap.service.join.sessions import load_keys
from bootstrap.service.pki.authority import CaStore
from bootstrap.store import Attestation
from bootstrap.store import backup as bk
from bootstrap.store.backup import container, contents
from bootstrap.store.sqlite import SCHEMA, SCHEMA_VERSION, SqliteStore
from tests.support.service import EkCa, Running, running, settings_for
from tests.support.softnode import SoftNode, post

PASS = b"correct horse battery staple"
NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


@pytest.fixture(autouse=True)
def fast_kdf(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cheap scrypt for the many archives made here; test_default_cost covers the real cost."""
    monkeypatch.setattr(container, "SCRYPT_LOG2_N", 10)


def conf(tmp: Path, ek_ca: EkCa, name: str, **kw: Any) -> Settings:
    folder = tmp / name
    folder.mkdir(exist_ok=True)
    return settings_for(folder, ek_ca, session_ttl="10m", **kw)  # long enough to never expire mid-test


def tree(folder: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every entry under ``folder``: mode and (for files) content."""
    out: dict[str, tuple[int, bytes | None]] = {}
    for path in sorted(folder.rglob("*")):
        mode = stat.S_IMODE(path.lstat().st_mode)
        out[str(path.relative_to(folder))] = (mode, path.read_bytes() if path.is_file() else None)
    return out


async def make_state(s: Settings, nodes: tuple[str, ...] = ("gpu-1",)) -> None:
    """A state_dir as the service leaves it (CA, session key, store) with a few node records."""
    service = await build_service(s, kube=False)
    try:
        for n, name in enumerate(nodes):
            await service.store.commit(
                Attestation(
                    node_name=name,
                    ek_sha256=f"{n:x}".rjust(64, "a"),
                    ak_public=b"\x00\x10ak",
                    spiffe_id=f"spiffe://fleet.test/node/{name}",
                    counters=Counters(1, 0, 100),
                    svid_serial="0a",
                    attested_at=NOW,
                    expires_at=NOW + dt.timedelta(hours=1),
                ),
                session_id=f"s-{name}",
                session_expires_at=NOW + dt.timedelta(minutes=1),
                action="join",
                check=lambda _r: None,
            )
    finally:
        await service.close()


@pytest.fixture
async def archive(tmp_path: Path, ek_ca: EkCa) -> Path:
    src = conf(tmp_path, ek_ca, "src")
    await make_state(src)
    out = tmp_path / "backup.ngb"
    bk.backup(src, out, passphrase=PASS, now=NOW)
    return out


@pytest.fixture
def target(tmp_path: Path, ek_ca: EkCa) -> Settings:
    return conf(tmp_path, ek_ca, "dst")


def refused(s: Settings, archive: Path, code: str, passphrase: bytes = PASS, **kw: Any) -> bk.BackupError:
    """restore fails with ``code`` and leaves no state_dir behind."""
    with pytest.raises(bk.BackupError) as info:
        bk.restore(s, archive, passphrase=passphrase, **kw)
    assert info.value.code == code, info.value
    assert info.value.detail
    assert not s.state_dir.exists()
    return info.value


def cert_files(tmp: Path, name: str, node: SoftNode, cert_pem: str) -> tuple[Path, Path]:
    key_file, cert_file = tmp / f"{name}.key", tmp / f"{name}.pem"
    key_file.write_bytes(
        node.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    cert_file.write_text(cert_pem)
    return cert_file, key_file


async def renew(r: Running, node: SoftNode, creds: tuple[Path, Path]) -> tuple[int, dict[str, Any]]:
    fresh = SoftNode(node.tpm, node.name, node.ek_certificate)
    async with r.http(creds) as http:
        status, start = await post(http, f"{r.base}/v1/nodes/self/renew", {"csr": fresh.csr_pem.decode()})
        if status != 200:
            return status, start
        body = fresh.evidence(start["session"], base64.b64decode(start["nonce"]), start["pcr_selection"])
        return await post(http, f"{r.base}/v1/nodes/self/renew", body)


# -- the test -------------------------------------------------------------------------------


async def test_restored_service_verifies_old_svids_and_refuses_used_sessions(
    tmp_path: Path, ek_ca: EkCa
) -> None:
    old = conf(tmp_path, ek_ca, "old")
    node = ek_ca.node("gpu-b1")
    out = tmp_path / "nodegate.ngb"
    async with running(old) as r:
        async with r.http() as http:
            status, start = await post(http, f"{r.base}/v1/join/start", node.start_body())
            assert status == 200, start
            finish = node.finish_body(start)
            status, joined = await post(http, f"{r.base}/v1/join/finish", finish)
            assert status == 200, joined
        info = bk.backup(old, out, passphrase=PASS, now=NOW)  # the service keeps running
    assert info.store_included
    assert info.store_schema == SCHEMA_VERSION
    assert (info.authorities, info.session_keys) == (1, 1)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600

    new = conf(tmp_path, ek_ca, "new")
    assert not new.state_dir.exists()
    restored = bk.restore(new, out, passphrase=PASS)
    assert restored.files == info.files
    for name in ("session.key", "ca/index.json"):
        assert (new.state_dir / name).read_bytes() == (old.state_dir / name).read_bytes()

    async with running(new) as r:
        async with r.http() as http, http.get(f"{r.base}/v1/bundle?format=pem") as resp:
            bundle = x509.load_pem_x509_certificates(await resp.read())
        leaf = x509.load_pem_x509_certificates(joined["svid"].encode())[0]
        sid = svid.verify_svid(leaf, roots=bundle, trust_domain="fleet.test", now=dt.datetime.now(dt.UTC))
        assert str(sid) == joined["spiffe_id"]
        record = await r.service.store.get("gpu-b1")
        assert record is not None
        assert f"{leaf.serial_number:x}" in record.svid_serials
        # (the replay goes first: after the renewal below its quote's clock would be too old)
        # the finished session is still used: the restored store remembers it, and the restored
        # session key still opens the token, so the answer is session_reused, not session_unknown
        async with r.http() as http:
            status, replay = await post(http, f"{r.base}/v1/join/finish", finish)
        assert (status, replay["code"]) == (403, "session_reused"), replay
        # the old SVID authenticates the node to the restored service (mTLS renewal)
        status, renewed = await renew(r, node, cert_files(tmp_path, "gpu-b1", node, joined["svid"]))
        assert status == 200, renewed

    async with running(conf(tmp_path, ek_ca, "unrelated")) as r, r.http() as http:
        status, other = await post(http, f"{r.base}/v1/join/finish", finish)
    assert (status, other["code"]) == (403, "session_unknown")  # the key is what the archive carried


async def test_restored_files_are_private(archive: Path, target: Settings) -> None:
    old = os.umask(0)
    try:
        bk.restore(target, archive, passphrase=PASS)
    finally:
        os.umask(old)
    entries = tree(target.state_dir)
    assert set(entries) >= {"session.key", "nodegate.db", "ca", "ca/index.json"}
    for name, (mode, data) in entries.items():
        assert mode == (0o600 if data is not None else 0o700), name
    assert stat.S_IMODE(target.state_dir.stat().st_mode) == 0o700


async def test_backup_includes_uncheckpointed_writes_of_a_running_store(tmp_path: Path, ek_ca: EkCa) -> None:
    src = conf(tmp_path, ek_ca, "src")
    await make_state(src)
    store = await SqliteStore.open(src.state_dir / "nodegate.db")
    try:
        await store.revoke("gpu-1", actor="admin", reason="RMA")  # in the WAL, not the main file
        assert (src.state_dir / "nodegate.db-wal").stat().st_size > 0
        bk.backup(src, tmp_path / "a.ngb", passphrase=PASS, now=NOW)
    finally:
        await store.close()
    dst = conf(tmp_path, ek_ca, "dst")
    bk.restore(dst, tmp_path / "a.ngb", passphrase=PASS)
    restored = await SqliteStore.open(dst.state_dir / "nodegate.db")
    try:
        rec = await restored.get("gpu-1")
        assert rec is not None
        assert rec.revoked
    finally:
        await restored.close()


async def test_default_cost(tmp_path: Path, ek_ca: EkCa, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()
    src = conf(tmp_path, ek_ca, "src")
    await make_state(src)
    bk.backup(src, tmp_path / "a.ngb", passphrase=PASS, now=NOW)
    header = (tmp_path / "a.ngb").read_bytes()[: bk.HEADER_SIZE]
    assert header[:8] == b"NGBACKUP"
    assert struct.unpack(">HBBBB", header[8:14]) == (1, 1, 17, 8, 1)
    info = bk.restore(conf(tmp_path, ek_ca, "dst"), tmp_path / "a.ngb", passphrase=PASS)
    assert info.created_at == NOW


# -- archives that must be refused --------------------------------------------------------------------


def test_wrong_passphrase(archive: Path, target: Settings) -> None:
    err = refused(target, archive, "backup_wrong_passphrase", passphrase=b"correct horse battery stapl")
    assert "passphrase" in err.detail


@pytest.mark.parametrize(
    ("where", "code"),
    [
        (0, "backup_not_an_archive"),  # magic
        (9, "backup_version_unsupported"),  # format version
        (10, "backup_version_unsupported"),  # KDF id
        (11, "backup_wrong_passphrase"),  # scrypt N: another key
        (20, "backup_wrong_passphrase"),  # salt: another key
        (35, "backup_wrong_passphrase"),  # passphrase check
        (46, "backup_version_unsupported"),  # cipher id
        (50, "backup_corrupt"),  # nonce: the check passes, GCM does not
        (59, "backup_too_large"),  # length: the top byte
        (66, "backup_truncated"),  # length: one more byte than there is
        (-1, "backup_corrupt"),  # the GCM tag
        (-400, "backup_corrupt"),  # the sealed content
    ],
)
def test_flipped_byte(archive: Path, target: Settings, where: int, code: str) -> None:
    data = bytearray(archive.read_bytes())
    data[where] ^= 0x01
    archive.write_bytes(bytes(data))
    refused(target, archive, code)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_flipped_bit_is_refused(archive: Path, target: Settings, data: st.DataObject) -> None:
    original = archive.read_bytes()
    where = data.draw(st.integers(0, len(original) - 1), label="offset")
    bit = data.draw(st.integers(0, 7), label="bit")
    damaged = bytearray(original)
    damaged[where] ^= 1 << bit
    bad = archive.with_name("damaged.ngb")
    bad.write_bytes(bytes(damaged))
    with pytest.raises(bk.BackupError):
        bk.restore(target, bad, passphrase=PASS)
    assert not target.state_dir.exists()


@pytest.mark.parametrize(("where", "value"), [(11, 40), (11, 0), (12, 0), (12, 200), (13, 9)])
def test_kdf_parameters_out_of_range(archive: Path, target: Settings, where: int, value: int) -> None:
    data = bytearray(archive.read_bytes())
    data[where] = value  # an archive must not make restore spend gigabytes or hours
    archive.write_bytes(bytes(data))
    refused(target, archive, "backup_corrupt")


def test_version_bump_is_named(archive: Path, target: Settings) -> None:
    data = bytearray(archive.read_bytes())
    data[8:10] = struct.pack(">H", 2)
    archive.write_bytes(bytes(data))
    err = refused(target, archive, "backup_version_unsupported")
    assert "format version 2" in err.detail


@pytest.mark.parametrize("keep", [0, 4, 9, 30, bk.HEADER_SIZE, bk.HEADER_SIZE + 100, -1])
def test_truncated(archive: Path, target: Settings, keep: int) -> None:
    data = archive.read_bytes()
    archive.write_bytes(data[:keep])
    code = "backup_not_an_archive" if 0 <= keep < 8 else "backup_truncated"
    refused(target, archive, code)


def test_trailing_bytes(archive: Path, target: Settings) -> None:
    archive.write_bytes(archive.read_bytes() + b"\x00")
    refused(target, archive, "backup_trailing_data")


def test_two_archives_concatenated(archive: Path, target: Settings) -> None:
    archive.write_bytes(archive.read_bytes() * 2)
    refused(target, archive, "backup_trailing_data")


def test_not_an_archive(tmp_path: Path, target: Settings) -> None:
    junk = tmp_path / "junk"
    junk.write_bytes(b"SQLite format 3\x00" + bytes(100))
    refused(target, junk, "backup_not_an_archive")
    refused(target, tmp_path / "missing.ngb", "backup_io_error")


def _seal(manifest: dict[str, Any], files: list[tuple[str, bytes]]) -> bytes:
    manifest = {**manifest, "files": [[n, len(d)] for n, d in files]}
    return container.seal(contents.pack(manifest, [d for _, d in files]), PASS)


@pytest.mark.parametrize(
    "name", ["../evil", "/tmp/evil", "ca/../../evil", "ca/ca-0123.key", "tls/server.key", "ca/./index.json"]
)
def test_names_outside_the_fixed_set_are_refused(
    archive: Path, target: Settings, tmp_path: Path, name: str
) -> None:
    content = contents.unpack(container.open_sealed(archive, PASS))
    files = [*content.files.items(), (name, b"x")]
    crafted = tmp_path / "crafted.ngb"
    crafted.write_bytes(_seal(content.manifest, files))
    err = refused(target, crafted, "backup_corrupt")
    assert "does not restore" in err.detail
    assert not (tmp_path / "evil").exists()
    assert not Path("/tmp/evil").exists()


@pytest.mark.parametrize(
    "change",
    ["duplicate", "unlisted_tail", "missing_store", "missing_index", "stray_ca_file", "bad_db", "bad_key"],
)
def test_inconsistent_content_is_refused(
    archive: Path, target: Settings, tmp_path: Path, change: str
) -> None:
    content = contents.unpack(container.open_sealed(archive, PASS))
    files = list(content.files.items())
    manifest = dict(content.manifest)
    tail = b""
    if change == "duplicate":
        files.append(files[0])
    elif change == "missing_store":
        files = [f for f in files if f[0] != "nodegate.db"]
    elif change == "missing_index":
        files = [f for f in files if f[0] != "ca/index.json"]
    elif change == "stray_ca_file":
        files.append(("ca/ca-0123456789abcdef.pem", b"-----BEGIN CERTIFICATE-----\n"))
    elif change == "bad_db":
        files = [(n, b"not sqlite" * 100 if n == "nodegate.db" else d) for n, d in files]
    elif change == "bad_key":
        files = [(n, b"zz\n" if n == "session.key" else d) for n, d in files]
    crafted = tmp_path / "crafted.ngb"
    if change == "unlisted_tail":
        manifest["files"] = [[n, len(d)] for n, d in files]
        tail = b"extra"
        crafted.write_bytes(container.seal(contents.pack(manifest, [d for _, d in files]) + tail, PASS))
    else:
        crafted.write_bytes(_seal(manifest, files))
    refused(target, crafted, "backup_corrupt")


# -- targets that must be refused ---------------------------------------------------------------------


def test_state_dir_not_empty_without_force(archive: Path, target: Settings) -> None:
    target.state_dir.mkdir(parents=True)
    (target.state_dir / "something").write_text("x")
    before = tree(target.state_dir)
    with pytest.raises(bk.StateDirNotEmpty, match="--force"):
        bk.restore(target, archive, passphrase=PASS)
    assert tree(target.state_dir) == before


def test_empty_state_dir_and_lost_found_are_fresh(archive: Path, target: Settings) -> None:
    (target.state_dir / "lost+found").mkdir(parents=True)
    target.state_dir.chmod(0o755)  # as a mounted volume may come
    bk.restore(target, archive, passphrase=PASS)
    assert (target.state_dir / "ca" / "index.json").exists()
    assert stat.S_IMODE(target.state_dir.stat().st_mode) == 0o700


async def test_force_replaces_an_existing_state(archive: Path, target: Settings, tmp_path: Path) -> None:
    await make_state(target, nodes=("other-1",))
    CaStore(target.state_dir / "ca", "fleet.test").rotate(NOW, dt.timedelta(hours=1))  # two CA files sets
    (target.state_dir / "nodegate.db-wal").write_bytes(b"a stale journal that must not be replayed")
    bk.restore(target, archive, passphrase=PASS, force=True)
    src = tmp_path / "src" / "state"
    assert (target.state_dir / "session.key").read_bytes() == (src / "session.key").read_bytes()
    assert sorted(os.listdir(target.state_dir / "ca")) == sorted(os.listdir(src / "ca"))
    assert not (target.state_dir / "nodegate.db-wal").exists()
    assert load_keys(target.state_dir) == load_keys(src)
    store = await SqliteStore.open(target.state_dir / "nodegate.db")
    try:
        assert [r.node_name for r in await store.list_nodes()] == ["gpu-1"]
    finally:
        await store.close()


async def test_force_refuses_a_store_in_use(archive: Path, target: Settings) -> None:
    await make_state(target, nodes=("other-1",))
    store = await SqliteStore.open(target.state_dir / "nodegate.db")
    try:
        before = {k: v for k, v in tree(target.state_dir).items() if not k.startswith("nodegate.db")}
        with pytest.raises(bk.StoreInUse, match="in use"):
            bk.restore(target, archive, passphrase=PASS, force=True)
        after = {k: v for k, v in tree(target.state_dir).items() if not k.startswith("nodegate.db")}
        assert after == before
        assert [r.node_name for r in await store.list_nodes()] == ["other-1"]
    finally:
        await store.close()


def test_other_trust_domain_or_store_kind(archive: Path, tmp_path: Path, ek_ca: EkCa) -> None:
    err = refused(conf(tmp_path, ek_ca, "td", trust_domain="other.test"), archive, "restore_mismatch")
    assert "trust domain" in err.detail
    err = refused(conf(tmp_path, ek_ca, "kind", store="kubernetes"), archive, "restore_mismatch")
    assert "store" in err.detail


async def test_a_store_newer_than_this_code_is_refused(tmp_path: Path, ek_ca: EkCa) -> None:
    src = conf(tmp_path, ek_ca, "src")
    await make_state(src)
    db = sqlite3.connect(src.state_dir / "nodegate.db")
    db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    db.commit()
    db.close()
    info = bk.backup(src, tmp_path / "a.ngb", passphrase=PASS, now=NOW)  # copying it is fine
    assert info.store_schema == SCHEMA_VERSION + 1
    err = refused(conf(tmp_path, ek_ca, "dst"), tmp_path / "a.ngb", "restore_mismatch")
    assert f"schema version {SCHEMA_VERSION + 1}" in err.detail


async def test_a_store_from_an_older_nodegate_is_migrated_after_restore(
    archive: Path, target: Settings
) -> None:
    bk.restore(target, archive, passphrase=PASS)

    def v2(db: sqlite3.Connection) -> None:  # what a future release might add
        db.execute("ALTER TABLE nodes ADD COLUMN labels TEXT NOT NULL DEFAULT '{}'")

    store = await SqliteStore.open(target.state_dir / "nodegate.db", _migrations=(*SCHEMA, v2))
    try:
        assert [r.node_name for r in await store.list_nodes()] == ["gpu-1"]
    finally:
        await store.close()
    db = sqlite3.connect(target.state_dir / "nodegate.db")
    try:
        assert db.execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION + 1,)
    finally:
        db.close()


# -- backup refusals ----------------------------------------------------------------------------------


def test_backup_of_an_empty_state_dir(tmp_path: Path, ek_ca: EkCa) -> None:
    s = conf(tmp_path, ek_ca, "empty")
    with pytest.raises(bk.StateMissing, match="ever started"):
        bk.backup(s, tmp_path / "a.ngb", passphrase=PASS, now=NOW)
    assert not (tmp_path / "a.ngb").exists()


async def test_backup_never_overwrites(archive: Path, tmp_path: Path, ek_ca: EkCa) -> None:
    before = archive.read_bytes()
    with pytest.raises(bk.BackupIoError, match="exists"):
        bk.backup(conf(tmp_path, ek_ca, "src"), archive, passphrase=PASS, now=NOW)
    assert archive.read_bytes() == before


async def test_backup_needs_a_real_passphrase(tmp_path: Path, ek_ca: EkCa) -> None:
    src = conf(tmp_path, ek_ca, "src")
    await make_state(src)
    with pytest.raises(bk.BackupError, match="at least"):
        bk.backup(src, tmp_path / "a.ngb", passphrase=b"short", now=NOW)
    assert not (tmp_path / "a.ngb").exists()


async def test_backup_refuses_a_ca_of_another_trust_domain(tmp_path: Path, ek_ca: EkCa) -> None:
    src = conf(tmp_path, ek_ca, "src")
    await make_state(src)
    with pytest.raises(bk.StateMissing, match="trust domain"):
        bk.backup(
            src.model_copy(update={"trust_domain": "other.test"}), tmp_path / "a", passphrase=PASS, now=NOW
        )


# -- the kubernetes store -----------------------------------------------------------------------------


def kube_state(tmp: Path, ek_ca: EkCa, name: str) -> Settings:
    s = conf(tmp, ek_ca, name, store="kubernetes")
    CaStore(s.state_dir / "ca", s.trust_domain).load_or_create(NOW)
    load_keys(s.state_dir)
    return s


def test_kubernetes_store_backs_up_only_the_files(tmp_path: Path, ek_ca: EkCa) -> None:
    src = kube_state(tmp_path, ek_ca, "src")
    info = bk.backup(src, tmp_path / "k.ngb", passphrase=PASS, now=NOW)
    assert not info.store_included
    assert "nodegate.db" not in info.files
    assert "NOT the store" in info.note
    assert "NodeAttestation" in info.note
    dst = conf(tmp_path, ek_ca, "dst", store="kubernetes")
    restored = bk.restore(dst, tmp_path / "k.ngb", passphrase=PASS)
    assert restored.store == "kubernetes"
    assert sorted(p.name for p in dst.state_dir.iterdir()) == ["ca", "session.key"]
    assert CaStore(dst.state_dir / "ca", "fleet.test").load().signer.stem == (
        CaStore(src.state_dir / "ca", "fleet.test").load().signer.stem
    )
    refused(conf(tmp_path, ek_ca, "sq"), tmp_path / "k.ngb", "restore_mismatch")


# -- command line -------------------------------------------------------------------------------------


def parse(kind: str, argv: list[str]) -> argparse.Namespace:
    return arguments.parser().parse_args([kind, *argv])


@pytest.fixture
def passfile(tmp_path: Path) -> Path:
    f = tmp_path / "pass"
    f.write_bytes(PASS + b"\n")
    f.chmod(0o600)
    return f


def config_file(tmp: Path, s: Settings, name: str) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(f"trust_domain: {s.trust_domain}\nstate_dir: {s.state_dir}\nstore: {s.store}\n")
    return path


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(backup_cli.PASSPHRASE_ENV, raising=False)


@pytest.mark.usefixtures("no_env")
async def test_cli_round_trip(
    tmp_path: Path, ek_ca: EkCa, passfile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = conf(tmp_path, ek_ca, "src")
    await make_state(src)
    out = tmp_path / "cli.ngb"
    argv = ["--config", str(config_file(tmp_path, src, "src")), "--out", str(out), "--passphrase-file"]
    assert backup_cli.cli_backup(parse("backup", [*argv, str(passfile)])) == 0
    printed = capsys.readouterr()
    assert "wrote" in printed.out
    assert f"sqlite store (schema version {SCHEMA_VERSION})" in printed.out
    dst = conf(tmp_path, ek_ca, "dst")
    dst_conf = str(config_file(tmp_path, dst, "dst"))
    args = parse("restore", ["--config", dst_conf, "--archive", str(out), "--passphrase-file", str(passfile)])
    assert backup_cli.cli_restore(args) == 0
    printed_restore = capsys.readouterr()
    assert "restored the backup of 20" in printed_restore.out
    assert backup_cli.cli_restore(args) == 1  # now the state_dir is not empty
    err = capsys.readouterr().err
    assert "[restore_target_not_empty]" in err
    forced = parse(
        "restore",
        ["--config", dst_conf, "--archive", str(out), "--passphrase-file", str(passfile), "--force"],
    )
    assert backup_cli.cli_restore(forced) == 0
    passfile.chmod(0o644)
    assert backup_cli.cli_restore(forced) == 0
    loose = capsys.readouterr()
    assert "readable by other users" in loose.err
    for text in (printed.out, printed.err, printed_restore.out, err, loose.out, loose.err):
        assert PASS.decode() not in text


@pytest.mark.usefixtures("no_env")
async def test_cli_passphrase_from_the_environment(
    tmp_path: Path, ek_ca: EkCa, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = kube_state(tmp_path, ek_ca, "src")
    argv = ["--config", str(config_file(tmp_path, src, "src")), "--out", str(tmp_path / "e.ngb")]
    assert backup_cli.cli_backup(parse("backup", argv)) == 2  # no passphrase at all
    assert backup_cli.PASSPHRASE_ENV in capsys.readouterr().err
    monkeypatch.setenv(backup_cli.PASSPHRASE_ENV, PASS.decode())
    assert backup_cli.cli_backup(parse("backup", argv)) == 0
    assert "NOT the store" in capsys.readouterr().out
    monkeypatch.setenv(backup_cli.PASSPHRASE_ENV, "wrong passphrase here")
    dst = conf(tmp_path, ek_ca, "dst", store="kubernetes")
    rargs = ["--config", str(config_file(tmp_path, dst, "dst")), "--archive", str(tmp_path / "e.ngb")]
    assert backup_cli.cli_restore(parse("restore", rargs)) == 1
    err = capsys.readouterr().err
    assert "[backup_wrong_passphrase]" in err
    assert "wrong passphrase here" not in err
    assert not dst.state_dir.exists()


@pytest.mark.usefixtures("no_env")
def test_cli_usage_errors(tmp_path: Path, passfile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("no_such_key: 1\n")
    argv = ["--config", str(bad), "--out", str(tmp_path / "x"), "--passphrase-file", str(passfile)]
    assert backup_cli.cli_backup(parse("backup", argv)) == 2
    assert "no_such_key" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.write_bytes(b"\n")
    argv = ["--out", str(tmp_path / "x"), "--passphrase-file", str(empty)]
    assert backup_cli.cli_backup(parse("backup", argv)) == 2
    assert "empty" in capsys.readouterr().err
    argv = ["--out", str(tmp_path / "x"), "--passphrase-file", str(tmp_path / "none")]
    assert backup_cli.cli_backup(parse("backup", argv)) == 2
    for inline in (["--passphrase", "s3cret-value"], ["--passphrase=s3cret-value"]):
        with pytest.raises(SystemExit):
            parse("backup", [*inline, "--out", "y"])  # no way to put it on the command line
        assert "s3cret-value" not in capsys.readouterr().err


def test_passphrase_file_newlines(tmp_path: Path) -> None:
    f = tmp_path / "p"
    for raw, want in [(b"abc\n", b"abc"), (b"abc\r\n", b"abc"), (b"abc", b"abc"), (b"abc\n\n", b"abc\n")]:
        f.write_bytes(raw)
        assert backup_cli.read_passphrase(f, {}) == want
    assert backup_cli.read_passphrase(None, {backup_cli.PASSPHRASE_ENV: "from env"}) == b"from env"
    with pytest.raises(ValueError, match="no passphrase"):
        backup_cli.read_passphrase(None, {})
