"""Building the image (`scripts/image/build.py`, once per test session) and running it with podman
as the chart's pod would: its user, read-only root, emptyDirs as tmpfs, ConfigMaps and Secrets as
read-only bind mounts, host network (the tests' peers are on loopback).

What this needs and why it may not be there: root (mmdebstrap's root mode and rootful podman) and
the Debian packages mmdebstrap and podman (`make image-deps`; .ci/run installs them). On a machine
without root the tests skip, saying so; with root but without the packages they fail in CI and
skip elsewhere, naming the make target."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import lockfile  # noqa: E402, F401  (scripts/lockfile.py; the image tests read the lock through it)

sys.path.insert(0, str(ROOT / "scripts"))

BUILD = ROOT / "scripts" / "image" / "build.py"
# Kept across sessions: the dependency wheels cache (wheels-<key>) lives here.
OUT = ROOT / "build" / "image-test"
# The build machine's cgroup2 hierarchy when it is mounted beside v1 controllers ("hybrid"): crun
# refuses that layout, so podman runs in a private mount namespace without it (--cgroups disabled).
HYBRID_CGROUP2 = Path("/sys/fs/cgroup/unified")
HINT = "`make image-deps` installs mmdebstrap and podman (.ci/run does)"


def require_root_and_tools(*tools: str) -> None:
    """Skip where the machine cannot build or run images at all; fail in CI when a tool is missing."""
    if os.geteuid() != 0:
        pytest.skip("the image is built with mmdebstrap's root mode and run with rootful podman: needs root")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        message = f"{', '.join(missing)} not installed: {HINT}"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@dataclass(frozen=True)
class Built:
    out: Path
    info: dict[str, object]

    @property
    def digest(self) -> str:
        return str(self.info["digest"])

    @property
    def name(self) -> str:
        return str(self.info["name"])

    @property
    def layout(self) -> Path:
        return self.out / "oci"

    @property
    def archive(self) -> Path:
        return Path(str(self.info["archive"]))

    @property
    def rootfs(self) -> Path:
        return self.out / "rootfs"

    def blob(self, digest: str) -> bytes:
        return (self.layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes()

    def manifest(self) -> dict[str, object]:
        return json.loads(self.blob(self.digest))  # type: ignore[no-any-return]

    def config(self) -> dict[str, object]:
        desc = self.manifest()["config"]
        assert isinstance(desc, dict)
        return json.loads(self.blob(str(desc["digest"])))  # type: ignore[no-any-return]


# What the image is made of: a change to any of these builds it again (else the session reuses
# the last build in OUT; test_image_build still builds once more and compares the digests).
INPUTS = (
    "attest",
    "admission",
    "bootstrap",
    "pyproject.toml",
    "uv.lock",
    "README.md",
    "scripts/image",
    "scripts/lockfile.py",
)


def input_key() -> str:
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--", *INPUTS], capture_output=True, check=True
    ).stdout.split(b"\0")
    digest = hashlib.sha256()
    for rel in sorted(f for f in files if f):
        path = ROOT / rel.decode()
        digest.update(rel + b"\0" + (path.read_bytes() if path.is_file() else b"") + b"\0")
    # The image's revision label and its timestamps come from the commit (scripts/image/build.py),
    # so a new commit is a new image even when no input file changed.
    for what in (["rev-parse", "HEAD"], ["log", "-1", "--format=%ct"]):
        digest.update(subprocess.run(["git", "-C", str(ROOT), *what], capture_output=True, check=True).stdout)
    digest.update(os.environ.get("SOURCE_DATE_EPOCH", "").encode())
    for sources in (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")):
        if sources.is_file():
            digest.update(sources.read_bytes())
    return digest.hexdigest()


def build_once(out: Path = OUT) -> Built:
    """The last build in ``out`` when its inputs are unchanged, else a new one."""
    key = input_key()
    stamp = out / "inputs.sha256"
    info_file = out / "build.json"
    if stamp.is_file() and stamp.read_text() == key and info_file.is_file():
        info = json.loads(info_file.read_text())
        if Path(str(info["archive"])).is_file() and (out / "oci" / "index.json").is_file():
            print(f"\nimage: reusing {info['digest']} from {out} (inputs unchanged)")
            return Built(out, info)
    stamp.unlink(missing_ok=True)
    built = build(out)
    stamp.write_text(key)
    return built


def build(out: Path = OUT) -> Built:
    """`make image` into ``out``; its build.json says digest, size and seconds per step."""
    proc = subprocess.run(
        [sys.executable, str(BUILD), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"image build failed ({proc.returncode}): {proc.stderr[-3000:]}", pytrace=False)
    info = json.loads(proc.stdout)
    size = info["uncompressed_bytes"] / 1e6
    print(f"\nimage: {info['name']} {info['digest']} {size:.1f} MB {info['seconds']}")
    return Built(out, info)


@dataclass
class Podman:
    """Rootful podman with its own storage under ``state`` (nothing shared with other users of the
    machine), no cgroups (this sandbox delegates none) and rlimits it may set."""

    state: Path
    names: list[str] = field(default_factory=list)

    def argv(self, *args: str) -> list[str]:
        base = [
            "podman",
            *("--root", str(self.state / "root"), "--runroot", str(self.state / "run")),
            *("--storage-driver", self.driver, "--cgroup-manager", "cgroupfs", "--events-backend", "none"),
            *args,
        ]
        if HYBRID_CGROUP2.is_dir() and os.path.ismount(HYBRID_CGROUP2):
            # umount only in a private mount namespace (unshare makes propagation private).
            return ["unshare", "-m", "sh", "-c", f'umount {HYBRID_CGROUP2} && exec "$@"', "sh", *base]
        return base

    driver: str = "overlay"

    def run_args(self, name: str) -> list[str]:
        self.names.append(name)
        return [
            "run",
            *("--name", name, "--network", "host", "--cgroups", "disabled", "--read-only"),
            # Lower than the machine's limits: raising them needs CAP_SYS_RESOURCE, which it lacks.
            *("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"),
            "--rm",
        ]

    def call(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout, check=False)

    def cleanup(self) -> None:
        for name in self.names:
            self.call("rm", "-f", "-t", "0", name, timeout=60)


def start_podman(state: Path, archive: Path, image: str) -> tuple[Podman | None, str]:
    """Podman with the image loaded, or None and why it cannot run containers here."""
    last = ""
    for driver in ("overlay", "vfs"):
        podman = Podman(state / driver, driver=driver)
        loaded = podman.call("load", "-q", "-i", str(archive))
        if loaded.returncode != 0:
            last = f"podman load ({driver}): {loaded.stderr.strip()[-500:]}"
            continue
        probe = podman.call(*podman.run_args(f"probe-{driver}"), "--entrypoint", "true", image, timeout=120)
        if probe.returncode == 0:
            return podman, ""
        last = f"podman run ({driver}): {probe.stderr.strip()[-500:]}"
    return None, last
