"""Files that hold keys and credentials: written atomically with mode 0600, read with a size cap.

A crash at any moment leaves either the old file or the new one, never a torn mix: the data goes
to a temporary file in the same folder, is fsynced, renamed over the target, and the folder is
fsynced so the rename itself survives a power loss.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

MAX_READ = 1024 * 1024


def ensure_dir(path: Path, mode: int = 0o700) -> Path:
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    return path


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` (mode 0600 unless told otherwise), all or nothing."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask may have narrowed or (for 0644 files) widened nothing
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def write_all_atomic(folder: Path, files: Mapping[str, bytes], mode: int = 0o600) -> None:
    """Several files, each atomic. Callers order them so a partial set is still consistent
    (for example: keys and certificates first, the index that names them last)."""
    for name, data in files.items():
        write_atomic(folder / name, data, mode)


def read_limited(path: Path, limit: int = MAX_READ) -> bytes:
    with path.open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes")
    return data


def create_exclusive(path: Path, data: bytes, mode: int = 0o600) -> bool:
    """Write ``path`` only if it does not exist yet; False when another process won the race.
    (Two replicas starting on one state_dir must agree on one session key and one CA.)"""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    write_atomic(tmp, data, mode)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
    _fsync_dir(path.parent)
    return True


def exposure(path: Path) -> str | None:
    """Why a secret file is open to more than this process's user (None when it is not).

    Others get nothing. The group may read only the way a Kubernetes Secret volume with an
    ``fsGroup`` gives it: the file belongs to another user and to one of this process's groups,
    so the group bit is how this process reads it (the Helm chart mounts the CA 0440 so)."""
    st = path.stat()
    mode = st.st_mode & 0o777
    if mode & 0o007:
        return f"{path} is open to every user (mode {mode:04o}); chmod 600 it"
    if mode & 0o030:
        return f"{path} is writable by its group (mode {mode:04o}); chmod 600 it"
    if mode & 0o040:
        ours = st.st_gid == os.getegid() or st.st_gid in os.getgroups()
        if st.st_uid == os.geteuid() or not ours:
            return f"{path} is readable by its group (mode {mode:04o}); chmod 600 it"
    return None
