"""The disk-key secret in ``nodegate backup`` / ``restore`` (docs/backup.md, docs/disk-keys.md):
carried when there is one, required when disk_keys is configured, checked before anything is
written, restored with its marker (so a later loss is noticed at start)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from bootstrap.service.app import build_service
from bootstrap.service.pki.startup import StartupError
from bootstrap.store import backup as bk
from bootstrap.store.backup import container
from bootstrap.store.diskkeys import FileVault
from tests.support.service import EkCa, settings_for

NOW = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
PASS = b"a long backup passphrase"
DISK = {
    "pcr_policy": {"classes": [{"name": "fleet", "golden": {"sha256": {0: ["00" * 32]}}}]},
    "disk_keys": {"classes": ["fleet"], "require_measured_boot": False},
}


@pytest.fixture(autouse=True)
def fast_kdf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(container, "SCRYPT_LOG2_N", 10)


def conf(tmp: Path, name: str, **kw: Any) -> Any:
    folder = tmp / name
    folder.mkdir(exist_ok=True)
    return settings_for(folder, EkCa.create(), **kw)


async def started(settings: Any) -> None:
    service = await build_service(settings, kube=False)
    await service.close()


async def test_the_secret_goes_into_the_archive_and_comes_back_with_its_marker(tmp_path: Path) -> None:
    src = conf(tmp_path, "src", **DISK)
    await started(src)
    doc = FileVault(src.state_dir).update_now(lambda d: d.rotated(NOW).revoked("ab" * 32))
    info = bk.backup(src, tmp_path / "a.ngb", passphrase=PASS, now=NOW)
    assert info.disk_keys
    assert "the disk-key secret" in info.note
    dst = src.model_copy(update={"state_dir": tmp_path / "dst"})
    restored = bk.restore(dst, tmp_path / "a.ngb", passphrase=PASS)
    assert restored.disk_keys
    assert FileVault(dst.state_dir).read_now() == doc
    assert (dst.state_dir / "disk-keys.json").stat().st_mode & 0o777 == 0o600
    (dst.state_dir / "disk-keys.json").unlink()  # lost after the restore: the start says so
    with pytest.raises(StartupError, match="restore it from a backup"):
        await started(dst)


async def test_a_state_dir_without_disk_keys_makes_an_archive_without_them(tmp_path: Path) -> None:
    src = conf(tmp_path, "src")
    await started(src)
    info = bk.backup(src, tmp_path / "a.ngb", passphrase=PASS, now=NOW)
    assert not info.disk_keys
    assert "disk-keys.json" not in info.files


async def test_configured_disk_keys_must_be_in_the_backup(tmp_path: Path) -> None:
    src = conf(tmp_path, "src", **DISK)
    await started(src)
    (src.state_dir / "disk-keys.json").unlink()
    with pytest.raises(bk.StateMissing, match=r"disk-keys\.json does not exist"):
        bk.backup(src, tmp_path / "a.ngb", passphrase=PASS, now=NOW)
    assert not (tmp_path / "a.ngb").exists()


async def test_a_damaged_secret_is_not_backed_up(tmp_path: Path) -> None:
    src = conf(tmp_path, "src", **DISK)
    await started(src)
    path = src.state_dir / "disk-keys.json"
    doc = json.loads(path.read_text())
    doc["current"] = 9
    path.write_text(json.dumps(doc))
    with pytest.raises(bk.StateMissing, match="not a disk-key document"):
        bk.backup(src, tmp_path / "a.ngb", passphrase=PASS, now=NOW)
