"""Public test data (certificates, firmware event logs, TPM quotes, NodeWright sample CRs) that the
project does not commit: it sits beside the checkout, in ``../shared/data`` (``NODEGATE_TEST_DATA``
may point elsewhere), each folder with the manifest it came with (source, commit, SHA-256, licence).

Every file is checked against its manifest before a test sees it. Where the folder is absent (a
checkout outside the workspace) the tests that need it skip with one line naming the folder; with
``NODEGATE_REQUIRE_TEST_DATA=1`` (CI) an absent folder or a file whose hash differs is a failure.
A hash that differs is always a failure: a test on other bytes than the manifest's proves nothing.

    from tests.support.shared_data import shared
    LOGS = shared("eventlogs")
    @pytest.mark.parametrize("name", LOGS.params("*.bin"))
    def test_x(name): raw = LOGS.read(name)
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

ENV_DIR = "NODEGATE_TEST_DATA"
ENV_REQUIRE = "NODEGATE_REQUIRE_TEST_DATA"
# The manifests name their list differently (they came with the data); each entry has file + sha256.
_MANIFESTS = ("manifest.json", "MANIFEST.json")
_LISTS = ("files", "entries", "logs")
_ROOT = Path(__file__).resolve().parents[2]


def data_root() -> Path:
    """Where the public test data is: $NODEGATE_TEST_DATA, else ../shared/data from the project."""
    configured = os.environ.get(ENV_DIR)
    return Path(configured) if configured else _ROOT.parent / "shared" / "data"


def required() -> bool:
    return os.environ.get(ENV_REQUIRE, "") not in ("", "0")


class DataMismatch(AssertionError):
    """A file is not the one its manifest records (or the manifest does not list it)."""


@dataclass
class SharedFolder:
    """One folder of the shared data (``eventlogs``, ``tpm``, ``ek-roots``, ``nodewright``, ...)."""

    name: str
    _manifest: dict[str, dict[str, Any]] | None = field(default=None, repr=False)
    _checked: set[str] = field(default_factory=set, repr=False)

    @property
    def path(self) -> Path:
        return data_root() / self.name

    @property
    def present(self) -> bool:
        return any((self.path / m).is_file() for m in _MANIFESTS)

    def absent_reason(self) -> str:
        return f"public test data absent: {self.path} (set {ENV_DIR} or see tests/support/shared_data.py)"

    def require(self) -> None:
        """Skip (or, under NODEGATE_REQUIRE_TEST_DATA=1, fail) unless the folder is there."""
        if self.present:
            return
        if required():
            pytest.fail(f"{self.absent_reason()}; {ENV_REQUIRE}=1 makes this a failure", pytrace=False)
        pytest.skip(self.absent_reason(), allow_module_level=True)

    def manifest(self) -> dict[str, dict[str, Any]]:
        """file -> its manifest entry (the folder must be present)."""
        self.require()
        if self._manifest is None:
            path = next(self.path / m for m in _MANIFESTS if (self.path / m).is_file())
            doc = json.loads(path.read_text())
            entries = next(doc[k] for k in _LISTS if k in doc)
            self._manifest = {e["file"]: e for e in entries}
        return self._manifest

    def entry(self, name: str) -> dict[str, Any]:
        entry = self.manifest().get(name)
        if entry is None:
            _mismatch(f"{self.path / name} is not listed in the folder's manifest")
        return entry

    def file(self, name: str) -> Path:
        """The path of one file, after its SHA-256 matched the manifest."""
        entry = self.entry(name)
        path = self.path / name
        if name not in self._checked:
            try:
                raw = path.read_bytes()
            except OSError as e:
                _mismatch(f"{path}: {e.strerror} (the manifest lists it)")
            if _digest(self.name, raw) != entry["sha256"]:
                _mismatch(f"{path} differs from its manifest entry (SHA-256)")
            self._checked.add(name)
        return path

    def read(self, name: str) -> bytes:
        return self.file(name).read_bytes()

    def names(self, pattern: str = "*", **where: str) -> list[str]:
        """Manifest-listed files matching a glob (on the path inside the folder) and entry fields."""
        return sorted(
            f
            for f, e in self.manifest().items()
            if fnmatch.fnmatch(f, pattern) and all(e.get(k) == v for k, v in where.items())
        )

    def folder(self) -> Path:
        """The folder itself, every listed file checked first: for a test that hands the whole
        folder to a program (skips, or fails, like any other use when the data is absent)."""
        self.verify_all()
        return self.path

    def verify_all(self) -> list[Path]:
        """Every listed file, each checked: for a test that hands the whole folder to a program."""
        return [self.file(n) for n in self.names()]

    def params(self, pattern: str = "*", names: Iterable[str] | None = None, **where: str) -> list[Any]:
        """Parameters for ``pytest.mark.parametrize`` over files of this folder. When the folder is
        absent this is one parameter that skips (or fails under NODEGATE_REQUIRE_TEST_DATA=1) with a
        line naming the folder, so the tests never vanish into an empty parameter set."""
        if not self.present:
            marks = [] if required() else [pytest.mark.skip(reason=self.absent_reason())]
            return [pytest.param(_Absent(self), id=f"{self.name}-absent", marks=marks)]
        chosen = list(names) if names is not None else self.names(pattern, **where)
        return [pytest.param(n, id=n) for n in chosen]


def _digest(folder: str, raw: bytes) -> str:
    """What the folder's manifest records: the file's SHA-256, except in ``ek-roots``, a root store
    whose manifest records each certificate's (the DER inside the file's PEM armour)."""
    if folder == "ek-roots" and raw.startswith(b"-----BEGIN CERTIFICATE-----"):
        body = raw.split(b"-----")[2]
        return hashlib.sha256(base64.b64decode(b"".join(body.split()), validate=True)).hexdigest()
    return hashlib.sha256(raw).hexdigest()


class _Absent(str):
    """The one parameter of an absent folder under NODEGATE_REQUIRE_TEST_DATA=1: using it fails."""

    folder: SharedFolder

    def __new__(cls, folder: SharedFolder) -> _Absent:
        obj = super().__new__(cls, f"<{folder.name} absent>")
        obj.folder = folder
        return obj


def _mismatch(message: str) -> NoReturn:
    raise DataMismatch(message)


_FOLDERS: dict[str, SharedFolder] = {}


def shared(name: str) -> SharedFolder:
    """The folder of that name (one object per folder, so each file is hashed once a run)."""
    if name not in _FOLDERS:
        _FOLDERS[name] = SharedFolder(name)
    return _FOLDERS[name]
