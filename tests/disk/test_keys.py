"""The key derivation and the sealed envelope (attest/diskkey.py), and the secret document
(bootstrap/store/diskkeys.py): pure, no TPM."""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attest import diskkey
from bootstrap.store.diskkeys import MAX_VERSIONS, FileVault, VaultDamaged, VaultDoc, parse_document

NOW = datetime(2026, 3, 1, tzinfo=UTC)
SECRET = bytes(range(32))
EK = "ab" * 32
VOL = uuid.UUID("6f1d2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b")

inputs = st.tuples(
    st.binary(min_size=32, max_size=32),
    st.text("0123456789abcdef", min_size=64, max_size=64),
    st.uuids(),
    st.integers(0, diskkey.MAX_EPOCH),
    st.integers(1, diskkey.MAX_VERSION),
)


def _key(t: tuple[bytes, str, uuid.UUID, int, int]) -> bytes:
    secret, ek, volume, epoch, version = t
    return diskkey.derive_key(secret, ek_sha256=ek, volume=volume, epoch=epoch, version=version)


@given(inputs, inputs)
def test_a_key_depends_on_every_input_and_on_nothing_else(a: tuple, b: tuple) -> None:  # type: ignore[type-arg]
    assert _key(a) == _key(a)
    assert (_key(a) == _key(b)) == (a == b)


def test_one_change_of_any_input_changes_the_key() -> None:
    base = diskkey.derive_key(SECRET, ek_sha256=EK, volume=VOL, epoch=0, version=1)
    others = [
        diskkey.derive_key(bytes(32), ek_sha256=EK, volume=VOL, epoch=0, version=1),
        diskkey.derive_key(SECRET, ek_sha256="cd" * 32, volume=VOL, epoch=0, version=1),
        diskkey.derive_key(SECRET, ek_sha256=EK, volume=uuid.uuid4(), epoch=0, version=1),
        diskkey.derive_key(SECRET, ek_sha256=EK, volume=VOL, epoch=1, version=1),
        diskkey.derive_key(SECRET, ek_sha256=EK, volume=VOL, epoch=0, version=2),
    ]
    assert len({base, *others}) == 6
    assert all(len(k) == diskkey.KEY_BYTES for k in others)


@pytest.mark.parametrize(
    "change",
    [
        {"secret": b"short"},
        {"ek_sha256": "AB" * 32},
        {"ek_sha256": "ab" * 31},
        {"epoch": -1},
        {"epoch": True},
        {"version": 0},
        {"version": diskkey.MAX_VERSION + 1},
    ],
)
def test_bad_inputs_are_refused(change: dict[str, object]) -> None:
    args: dict[str, object] = {"secret": SECRET, "ek_sha256": EK, "volume": VOL, "epoch": 0, "version": 1}
    args.update(change)
    secret = args.pop("secret")
    with pytest.raises(ValueError):  # noqa: PT011  (the message names the input; any is fine here)
        diskkey.derive_key(secret, **args)  # type: ignore[arg-type]


@given(
    st.binary(min_size=32, max_size=32), st.binary(max_size=64), st.integers(1, 1000), st.integers(1, 1000)
)
def test_sealed_keys_open_only_with_the_same_secret_and_context(
    transport: bytes, aad: bytes, v1: int, v2: int
) -> None:
    keys = {v1: os.urandom(32), v2: os.urandom(32)}
    sealed = diskkey.seal_keys(transport, keys, aad)
    assert diskkey.open_keys(transport, sealed, aad) == keys
    with pytest.raises(diskkey.DiskKeyUnsealable):
        diskkey.open_keys(bytes(b ^ 1 for b in transport), sealed, aad)
    with pytest.raises(diskkey.DiskKeyUnsealable):
        diskkey.open_keys(transport, sealed, aad + b"x")


@given(st.integers(0, 12 + 16 + 72 - 1))
def test_any_flipped_bit_of_a_sealed_release_is_refused(at: int) -> None:
    transport = bytes(32)
    sealed = bytearray(diskkey.seal_keys(transport, {1: bytes(32), 2: bytes(32)}, b"ctx"))
    sealed[at % len(sealed)] ^= 0x01
    with pytest.raises(diskkey.DiskKeyUnsealable):
        diskkey.open_keys(transport, bytes(sealed), b"ctx")


def test_sealed_keys_of_the_wrong_size_are_refused() -> None:
    with pytest.raises(diskkey.DiskKeyUnsealable):
        diskkey.open_keys(bytes(32), b"\x00" * 20, b"")
    with pytest.raises(ValueError, match=r"1\.\.2 keys"):
        diskkey.seal_keys(bytes(32), {1: bytes(32), 2: bytes(32), 3: bytes(32)}, b"")


# -- the document --------------------------------------------------------------------------------


def test_rotation_keeps_old_versions_until_retired_and_never_retires_the_current_one() -> None:
    doc = VaultDoc.new(NOW)
    assert (doc.current, doc.versions) == (1, (1,))
    first = doc.secret(1)
    doc = doc.rotated(NOW)
    assert (doc.current, doc.versions, doc.secret(1)) == (2, (1, 2), first)
    with pytest.raises(ValueError, match="current"):
        doc.retired(2)
    doc = doc.retired(1)
    assert (doc.versions, doc.secret(1)) == ((2,), None)
    with pytest.raises(ValueError, match="no version 1"):
        doc.retired(1)
    for _ in range(MAX_VERSIONS - 1):
        doc = doc.rotated(NOW)
    with pytest.raises(ValueError, match="retire"):
        doc.rotated(NOW)


def test_a_revocation_moves_one_tpm_up_one_epoch() -> None:
    doc = VaultDoc.new(NOW)
    assert doc.epoch(EK) == 0
    doc = doc.revoked(EK).revoked(EK)
    assert (doc.epoch(EK), doc.epoch("cd" * 32)) == (2, 0)


def test_the_document_round_trips_and_a_damaged_one_is_refused_without_its_secrets() -> None:
    doc = VaultDoc.new(NOW).rotated(NOW).revoked(EK)
    assert parse_document(doc.dump(), "x") == doc
    raw = json.loads(doc.dump())
    raw["current"] = 1  # not the newest
    with pytest.raises(VaultDamaged) as exc:
        parse_document(json.dumps(raw).encode(), "disk-keys.json")
    assert raw["secrets"][0]["key"] not in str(exc.value)
    assert "key=" not in repr(doc.secrets[0])  # a repr (a traceback, a log) never shows one


def test_the_file_is_private_created_once_and_changed_under_a_lock(tmp_path: Path) -> None:
    vault = FileVault(tmp_path)
    assert vault.read_now() is None
    first = vault.create_now(VaultDoc.new(NOW))
    assert (tmp_path / "disk-keys.json").stat().st_mode & 0o777 == 0o600
    assert vault.create_now(VaultDoc.new(NOW)) == first  # the first one stays
    changed = vault.update_now(lambda d: d.rotated(NOW))
    assert FileVault(tmp_path).read_now() == changed
    (tmp_path / "disk-keys.json").chmod(0o644)
    with pytest.raises(VaultDamaged, match="chmod 600"):
        FileVault(tmp_path).read_now()


def test_a_file_that_is_not_a_document_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "disk-keys.json"
    path.write_text('{"format": 1}')
    path.chmod(0o600)
    with pytest.raises(VaultDamaged, match="not a disk-key document"):
        FileVault(tmp_path).read_now()
