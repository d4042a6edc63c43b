"""Key and credential files: 0600, all-or-nothing replacement, size-capped reads, one winner."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap import files
from bootstrap.files import create_exclusive, ensure_dir, read_limited, write_all_atomic, write_atomic


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def strict_umask() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


class Boom(OSError):
    pass


def _boom(*_args: object, **_kwargs: object) -> None:
    raise Boom("injected failure")


# -- write_atomic -------------------------------------------------------------------------------


@pytest.mark.usefixtures("permissive_umask")
def test_write_atomic_creates_0600_even_with_a_permissive_umask(tmp_path: Path) -> None:
    target = tmp_path / "ca.key"
    write_atomic(target, b"secret")
    assert target.read_bytes() == b"secret"
    assert _mode(target) == 0o600
    assert _leftovers(tmp_path) == []


@pytest.mark.usefixtures("strict_umask")
def test_write_atomic_honours_an_explicit_mode_despite_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "bundle.pem"
    write_atomic(target, b"public", mode=0o644)
    assert _mode(target) == 0o644


@pytest.mark.usefixtures("permissive_umask")
def test_write_atomic_replace_tightens_a_loose_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "ca.key"
    target.write_bytes(b"old")
    target.chmod(0o666)
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert _mode(target) == 0o600


def test_write_atomic_replaces_the_inode(tmp_path: Path) -> None:
    # A rename, not an in-place rewrite: a reader holding the old file keeps the old bytes.
    target = tmp_path / "state"
    write_atomic(target, b"one")
    with target.open("rb") as reader:
        write_atomic(target, b"two")
        assert reader.read() == b"one"
    assert target.read_bytes() == b"two"


def test_write_atomic_empty_and_large(tmp_path: Path) -> None:
    write_atomic(tmp_path / "empty", b"")
    assert (tmp_path / "empty").read_bytes() == b""
    big = os.urandom(3 * 1024 * 1024 + 7)
    write_atomic(tmp_path / "big", big)
    assert (tmp_path / "big").read_bytes() == big


@pytest.mark.parametrize("fail", ["fsync", "replace", "fchmod"])
def test_failed_write_keeps_the_old_file_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: str
) -> None:
    target = tmp_path / "session.key"
    write_atomic(target, b"old content")
    monkeypatch.setattr(os, fail, _boom)
    with pytest.raises(Boom):
        write_atomic(target, b"new content that never lands")
    monkeypatch.undo()
    assert target.read_bytes() == b"old content"
    assert _mode(target) == 0o600
    assert _leftovers(tmp_path) == []


def test_write_failing_midway_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "ca.key"
    write_atomic(target, b"A" * 100)
    real_write = os.write
    calls = 0

    def short_then_fail(fd: int, data: bytes | memoryview) -> int:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise Boom("disk full")
        return real_write(fd, bytes(data[:10]))  # a short write: the loop must come back for more

    monkeypatch.setattr(os, "write", short_then_fail)
    with pytest.raises(Boom):
        write_atomic(target, b"B" * 100)
    monkeypatch.undo()
    assert calls == 2
    assert target.read_bytes() == b"A" * 100
    assert _leftovers(tmp_path) == []


def test_short_writes_are_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write

    def dribble(fd: int, data: bytes | memoryview) -> int:
        return real_write(fd, bytes(data[:3]))

    monkeypatch.setattr(os, "write", dribble)
    write_atomic(tmp_path / "f", b"0123456789abcdef")
    monkeypatch.undo()
    assert (tmp_path / "f").read_bytes() == b"0123456789abcdef"


def test_write_atomic_into_a_missing_folder_fails_cleanly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "nope" / "f", b"x")
    assert not (tmp_path / "nope").exists()


# -- write_all_atomic -----------------------------------------------------------------------------


def test_write_all_atomic_writes_every_file(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_bytes(b"old index")
    write_all_atomic(tmp_path, {"ca.key": b"k", "ca.pem": b"c", "index.json": b"new index"})
    assert (tmp_path / "ca.key").read_bytes() == b"k"
    assert (tmp_path / "ca.pem").read_bytes() == b"c"
    assert (tmp_path / "index.json").read_bytes() == b"new index"
    assert {_mode(tmp_path / n) for n in ("ca.key", "ca.pem", "index.json")} == {0o600}
    assert _leftovers(tmp_path) == []


def test_write_all_atomic_in_order_stops_at_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Keys first, index last: a failure on the index leaves the old index naming consistent files.
    (tmp_path / "index.json").write_bytes(b"old index")
    real_replace = os.replace

    def fail_on_index(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(dst).name == "index.json":
            raise Boom("crash")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_on_index)
    with pytest.raises(Boom):
        write_all_atomic(tmp_path, {"new.key": b"k", "index.json": b"new index"})
    monkeypatch.undo()
    assert (tmp_path / "new.key").read_bytes() == b"k"
    assert (tmp_path / "index.json").read_bytes() == b"old index"
    assert _leftovers(tmp_path) == []


def test_write_all_atomic_mode(tmp_path: Path) -> None:
    write_all_atomic(tmp_path, {"a.pem": b"a"}, mode=0o644)
    assert _mode(tmp_path / "a.pem") == 0o644


# -- read_limited -------------------------------------------------------------------------------


def test_read_limited_reads_up_to_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_limited(path, 100) == b"x" * 100
    assert read_limited(path) == b"x" * 100


def test_read_limited_refuses_oversize(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 101)
    with pytest.raises(ValueError, match="larger than 100 bytes"):
        read_limited(path, 100)


def test_read_limited_default_cap(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"\0" * (files.MAX_READ + 1))
    with pytest.raises(ValueError, match="larger than"):
        read_limited(path)


def test_read_limited_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_limited(tmp_path / "absent")


# -- create_exclusive ---------------------------------------------------------------------------


@pytest.mark.usefixtures("permissive_umask")
def test_create_exclusive_once(tmp_path: Path) -> None:
    target = tmp_path / "session.key"
    assert create_exclusive(target, b"first") is True
    assert create_exclusive(target, b"second") is False
    assert target.read_bytes() == b"first"
    assert _mode(target) == 0o600
    assert _leftovers(tmp_path) == []


def test_create_exclusive_never_overwrites_a_foreign_file(tmp_path: Path) -> None:
    target = tmp_path / "ca.key"
    target.write_bytes(b"written by another replica")
    assert create_exclusive(target, b"mine") is False
    assert target.read_bytes() == b"written by another replica"
    assert _leftovers(tmp_path) == []


def test_create_exclusive_later_callers_all_lose(tmp_path: Path) -> None:
    target = tmp_path / "session.key"
    results = [create_exclusive(target, f"candidate {i}".encode()) for i in range(5)]
    assert results == [True, False, False, False, False]
    assert target.read_bytes() == b"candidate 0"


def test_create_exclusive_concurrent_callers_agree_on_one_winner(tmp_path: Path) -> None:
    target = tmp_path / "session.key"
    n = 8
    start = threading.Barrier(n)
    results: dict[int, bool] = {}

    def contend(i: int) -> None:
        start.wait()
        results[i] = create_exclusive(target, f"replica {i}".encode())

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, won in results.items() if won]
    assert len(results) == n
    assert len(winners) == 1
    assert target.read_bytes() == f"replica {winners[0]}".encode()
    assert _leftovers(tmp_path) == []


def test_create_exclusive_mode(tmp_path: Path) -> None:
    target = tmp_path / "bundle.pem"
    assert create_exclusive(target, b"x", mode=0o640)
    assert _mode(target) == 0o640


# -- ensure_dir ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("permissive_umask")
def test_ensure_dir_creates_0700_with_parents(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "state"
    assert ensure_dir(path) == path
    assert path.is_dir()
    assert _mode(path) == 0o700


@pytest.mark.usefixtures("permissive_umask")
def test_ensure_dir_custom_mode_and_existing(tmp_path: Path) -> None:
    path = tmp_path / "shared"
    ensure_dir(path, 0o750)
    assert _mode(path) == 0o750
    (path / "keep").write_bytes(b"x")
    assert ensure_dir(path, 0o750) == path  # idempotent, contents untouched
    assert (path / "keep").read_bytes() == b"x"


def test_ensure_dir_refuses_a_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "state").write_bytes(b"")
    with pytest.raises(FileExistsError):
        ensure_dir(tmp_path / "state")
