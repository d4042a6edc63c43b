"""What stops ``nodegate serve`` from starting (issue 16 items 3, 7 and 9): a CA and a store that
do not belong together, a missing sqlite file, damaged files, a CA key others can read. Each is
one line that names the file and the fix; the CLI exits 2 without a traceback."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
import yaml

from bootstrap.cli.main import main as cli_main
from bootstrap.config import Settings
from bootstrap.service.pki.startup import STORE_MARKER, StartupError
from bootstrap.service.serve import start
from tests.service.test_abuse import base, http
from tests.support.service import EkCa, settings_for
from tests.support.softnode import join


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


async def with_a_node(settings: Settings, ek_ca: EkCa) -> None:
    """Start, join one node, stop: the store now knows a node of this CA."""
    s = await start(settings, kube=False)
    try:
        async with http(s) as h:
            status, out = await join(h, base(s), ek_ca.node("gpu-1"))
        assert status == 200, out
    finally:
        await s.close()


async def refused(settings: Settings, **kw: bool) -> str:
    with pytest.raises(StartupError) as info:
        await start(settings, kube=False, **kw)  # raises before it listens
    text = str(info.value)
    assert "\n" not in text
    return text


async def starts(settings: Settings, **kw: bool) -> None:
    s = await start(settings, kube=False, **kw)
    await s.close()


# -- item 3: the CA and the store belong together ---------------------------------------------


async def test_a_missing_ca_with_nodes_in_the_store_is_refused(tmp_path: Path, ek_ca: EkCa) -> None:
    """Before: a brand-new CA, and only "nodegate serving" in the log; every node then failed TLS."""
    settings = settings_for(tmp_path, ek_ca)
    await with_a_node(settings, ek_ca)
    ca_dir = settings.state_dir / "ca"
    shutil.rmtree(ca_dir)
    text = await refused(settings)
    assert str(ca_dir / "index.json") in text
    assert "docs/backup.md" in text
    assert "--new-ca" in text
    assert not (ca_dir / "index.json").exists()  # nothing was created
    (ca_dir).mkdir(exist_ok=True)
    await starts(settings, new_ca=True)  # on purpose
    await starts(settings)  # and from then on this CA is the store's


async def test_only_the_index_missing_is_refused_too(tmp_path: Path, ek_ca: EkCa) -> None:
    settings = settings_for(tmp_path, ek_ca)
    await with_a_node(settings, ek_ca)
    (settings.state_dir / "ca" / "index.json").unlink()
    assert "index.json is missing" in await refused(settings)


async def test_a_ca_that_did_not_issue_the_stores_svids_is_refused(tmp_path: Path, ek_ca: EkCa) -> None:
    settings = settings_for(tmp_path, ek_ca)
    await with_a_node(settings, ek_ca)
    (tmp_path / "other").mkdir()
    other = settings_for(tmp_path / "other", ek_ca)
    await starts(other)  # a CA of its own
    shutil.rmtree(settings.state_dir / "ca")
    shutil.copytree(other.state_dir / "ca", settings.state_dir / "ca")
    text = await refused(settings)
    assert "did not issue the store's SVIDs" in text
    assert "--new-ca" in text
    await starts(settings, new_ca=True)
    await starts(settings)


async def test_a_first_start_and_a_rotation_are_not_refused(tmp_path: Path, ek_ca: EkCa) -> None:
    settings = settings_for(tmp_path, ek_ca)
    await with_a_node(settings, ek_ca)
    assert cli_main(["ca", "rotate", "--config", str(config_file(tmp_path, settings))]) == 0
    await starts(settings)  # the old root is still in the set: the same lineage


async def test_a_missing_sqlite_file_is_not_recreated(tmp_path: Path, ek_ca: EkCa) -> None:
    settings = settings_for(tmp_path, ek_ca)
    await with_a_node(settings, ek_ca)
    db = settings.state_dir / "nodegate.db"
    for extra in ("", "-wal", "-shm"):
        Path(f"{db}{extra}").unlink(missing_ok=True)
    text = await refused(settings)
    assert str(db) in text
    assert STORE_MARKER in text
    assert "docs/backup.md" in text
    assert not db.exists()
    (settings.state_dir / STORE_MARKER).unlink()  # an empty store, on purpose
    await starts(settings)


# -- item 7: damaged files are one line, exit 2 ----------------------------------------------------


def config_file(tmp: Path, settings: Settings) -> Path:
    doc = {
        "trust_domain": settings.trust_domain,
        "listen": settings.listen,
        "admission": {"listen": settings.admission.listen},
        "state_dir": str(settings.state_dir),
        "ek_roots": [str(p) for p in settings.ek_roots],
        "server_names": list(settings.server_names),
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def damage_ca_key(state: Path) -> Path:
    key = next((state / "ca").glob("ca-*.key"))
    key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    return key


def damage_sqlite(state: Path) -> Path:
    db = state / "nodegate.db"
    for extra in ("-wal", "-shm"):
        Path(f"{db}{extra}").unlink(missing_ok=True)
    db.write_bytes(b"this is not a database" * 200)
    return db


@pytest.mark.parametrize(("damage", "fix"), [(damage_ca_key, "backup"), (damage_sqlite, "restore")])
async def test_damaged_files_stop_the_cli_with_one_line(
    tmp_path: Path, ek_ca: EkCa, capsys: pytest.CaptureFixture[str], damage: object, fix: str
) -> None:
    """Before: a Python traceback."""
    settings = settings_for(tmp_path, ek_ca)
    await with_a_node(settings, ek_ca)
    broken = damage(settings.state_dir)  # type: ignore[operator]
    capsys.readouterr()
    code = await _cli_serve(config_file(tmp_path, settings))
    err = capsys.readouterr().err
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.startswith("nodegate serve:")]
    assert len(lines) == 1, err
    assert str(broken) in lines[0] or str(broken.parent) in lines[0], err
    assert fix in lines[0]
    assert "Traceback" not in err


async def _cli_serve(config: Path) -> int:
    """``nodegate serve`` in a thread: it runs its own event loop."""
    return await asyncio.to_thread(cli_main, ["serve", "--config", str(config)])


# -- item 9: a CA key others can read ----------------------------------------------------------


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
async def test_a_ca_key_readable_by_others_is_refused(tmp_path: Path, ek_ca: EkCa, mode: int) -> None:
    settings = settings_for(tmp_path, ek_ca)
    await starts(settings)
    key = next((settings.state_dir / "ca").glob("ca-*.key"))
    key.chmod(mode)
    text = await refused(settings)
    assert str(key) in text
    assert "chmod 600" in text
    key.chmod(0o600)
    await starts(settings)


async def test_a_group_readable_key_of_a_secret_volume_is_accepted(tmp_path: Path, ek_ca: EkCa) -> None:
    """A Kubernetes Secret mounted 0440 with an fsGroup: owned by root, readable through the
    pod's group. Shown here with a file owned by another user and this process's group."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file to another user")
    settings = settings_for(tmp_path, ek_ca)
    await starts(settings)
    key = next((settings.state_dir / "ca").glob("ca-*.key"))
    os.chown(key, 65534, os.getegid())
    key.chmod(0o440)
    await starts(settings)
    os.chown(key, 65534, 65533)  # a group this process is not in
    assert "readable by its group" in await refused(settings)


class _SlowStore:
    """A store whose first ``failures`` answers are StoreUnavailable, like a real API server's 429
    "storage is (re)initializing" right after the NodeAttestation CRD is installed."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def has_nodes(self) -> bool:
        from bootstrap.store import StoreUnavailable

        self.calls += 1
        if self.calls <= self.failures:
            raise StoreUnavailable(
                "list nodeattestations: HTTP 429 Too Many Requests: storage is (re)initializing"
            )
        return False


async def test_a_store_that_answers_after_a_while_lets_the_start_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bootstrap.service.pki import startup

    monkeypatch.setattr(startup, "_STORE_BACKOFF", (0.0,))
    store = _SlowStore(failures=3)
    assert await startup._holds_nodes(store, "nodes depend on the missing CA") is False  # type: ignore[arg-type]
    assert store.calls == 4


async def test_a_store_that_never_answers_refuses_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from bootstrap.service.pki import startup

    monkeypatch.setattr(startup, "STORE_WAIT", 0.0)
    store = _SlowStore(failures=10**6)
    with pytest.raises(StartupError, match="storage is \\(re\\)initializing; cannot tell whether nodes"):
        await startup._holds_nodes(store, "nodes depend on the missing CA")  # type: ignore[arg-type]
    assert store.calls == 1
