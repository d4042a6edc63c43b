"""`make image`: the image the Helm chart runs, built from Debian's packages and this checkout,
with no base image from a container registry.

  1. wheels: nodegate's wheel from the checkout's tracked files (attest, admission, bootstrap,
     pyproject.toml, README.md, what the Dockerfile copies), and its runtime dependencies as
     uv.lock has them, hashes checked (scripts/lockfile.py; tpm2-pytss compiles against the build
     machine's libtss2-dev, bookworm's, the same libtss2 the image carries, with the build
     back-ends pyproject.toml pins). The dependency wheels are cached under
     build/image/wheels-<key>, the key being the locked sets and the build machine's Python.
  2. root file system: mmdebstrap, variant essential, of Debian bookworm (the build machine's apt
     sources) with python3, libtss2 and ca-certificates; no documentation but copyright files, no
     man pages or locales, no apt (the essential variant has none), no caches or logs.
  3. /opt/nodegate: a virtualenv of the image's own python3 with the wheels installed by pip (run
     from its wheel, so pip itself stays out of the image); all bytecode compiled as unchecked-hash
     .pyc files, which embed no timestamps and are never rewritten on the read-only root; and
     nodegate's wheel at /opt/nodegate/wheels/ for nodes (docs/node-join.md), with its
     requirements file (the wheel and its locked dependencies, hashed). `--wheel-only` builds just
     those two files into build/wheel (`make wheel`).
     /usr/share/nodegate/ek-roots: the TPM makers' EK root CAs of Debian's ruby-tpm-key-attestation
     (`ek_roots: [vendors]`), taken from the .deb (apt-get download, dpkg-deb -x; no Ruby in the
     image), each file checked against bootstrap/service/join/vendorroots.py, and its copyright file.
  4. an SPDX SBOM of the Debian and Python packages, inside the image at SBOM_PATH and beside it;
     the build stops if a Python package in it is not the locked one.
  5. oci.py packs the folder (sorted entries, times clamped to SOURCE_DATE_EPOCH, gzip without a
     time) into build/image/oci and build/image/nodegate-<version>.tar.

Reproducible: SOURCE_DATE_EPOCH (default: the last commit's time) fixes every timestamp, so the
same inputs (checkout, pins, Debian archive state, build machine) give the same image digest.
Needs root (mmdebstrap's root mode and chroot) and mmdebstrap; `make image-deps` installs it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import oci  # noqa: E402  (beside this file)
import sbom  # noqa: E402

REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import lockfile  # noqa: E402  (scripts/lockfile.py: the one lock)

SUITE = "bookworm"
VENV = "/opt/nodegate"
# What the Dockerfile copies into its build stage: the wheel's sources (README.md is its
# long description, so it is in the image too).
WHEEL_SOURCES = ("attest", "admission", "bootstrap", "pyproject.toml", "README.md")
WHEEL_DIR = "/opt/nodegate/wheels"  # nodegate's own wheel, for nodes to install
STAGE = "/tmp/wheels"  # noqa: S108  (inside the chroot, which nothing else uses during the build)
SBOM_PATH = "usr/share/doc/nodegate/sbom.spdx.json"
DESCRIPTION = "TPM-attested node bootstrap, hold gate and package admission"
IMAGE_NAME = "ghcr.io/nodegate/nodegate"
# What the Dockerfile's runtime stage installs besides python3: the libtss2 libraries tpm2-pytss
# loads (for the node commands) and the CA certificates.
DEBS = [
    "python3",
    "libtss2-esys-3.0.2-0",
    "libtss2-mu0",
    "libtss2-sys1",
    "libtss2-tctildr0",
    "libtss2-tcti-device0",
    "libtss2-rc0",
    "libtss2-fapi1",
    "ca-certificates",
]
# dpkg leaves these out of every package (the copyright files stay: licences travel with binaries).
DPKG_EXCLUDES = [
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/lintian/*",
    # glibc's iconv modules: Python's codecs do not use them.
    "path-exclude=/usr/lib/x86_64-linux-gnu/gconv/*",
    # udev's hardware database (libtss2 pulls in udev through tpm-udev): no udev runs in a
    # container, and without these sources udev's postinst compiles a near-empty hwdb.bin.
    "path-exclude=/lib/udev/hwdb.d/*",  # bookworm's udev ships /lib paths (merged by symlink)
]
# Same as the Dockerfile (PATH first: python3 on PATH is the venv's, for the chart's ca-init).
ENV = [
    f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    "PYTHONDONTWRITEBYTECODE=1",
    "PYTHONUNBUFFERED=1",
]
USER = "65532:65532"
ENTRYPOINT = ["nodegate"]
CMD = ["serve", "--config", "/etc/nodegate/config.yaml"]
# Build leftovers that differ from run to run or only serve a package manager.
LEFTOVERS = [
    "var/log/*",
    "var/cache/ldconfig/aux-cache",
    "var/cache/debconf/*-old",
    "var/lib/dpkg/*-old",
    "var/cache/apt",
    "var/lib/apt",
    "etc/*-",
    "etc/machine-id",
    "etc/hostname",
    "etc/resolv.conf",
    "tmp/*",
    "root/.cache",
]


def log(msg: str) -> None:
    print(f"image: {msg}", file=sys.stderr, flush=True)


def run(*cmd: str | Path, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], check=True, text=True, **kw)  # type: ignore[call-overload]


def git(*args: str) -> str:
    return run("git", "-C", REPO, *args, capture_output=True).stdout.strip()


def inputs() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    revision = git("rev-parse", "HEAD")
    if git(
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        "attest",
        "admission",
        "bootstrap",
        "pyproject.toml",
    ):
        revision += "-dirty"
    epoch = os.environ.get("SOURCE_DATE_EPOCH") or git("log", "-1", "--format=%ct")
    return {"version": project["version"], "revision": revision, "epoch": str(int(epoch))}


# What dependency_wheels leaves beside the wheels: the lock's selections it used.
RUNTIME, PINS, PIP, BUILD = "runtime.txt", "pins.txt", "pip.txt", "build-constraints.txt"


def dependency_wheels(python: str, out: Path) -> Path:
    """The locked runtime dependencies as wheels, hashes checked (and the locked pip's, to run it
    in the chroot); cached by key."""
    sets = {
        RUNTIME: lockfile.export("runtime"),
        PINS: lockfile.export("runtime", hashes=False),
        PIP: lockfile.export("pip"),
        BUILD: lockfile.export("build"),
    }
    tag = run(
        python, "-c", "import sys,sysconfig;print(sys.version,sysconfig.get_platform())", capture_output=True
    )
    key = hashlib.sha256(json.dumps(sets, sort_keys=True).encode() + tag.stdout.encode()).hexdigest()[:16]
    cache = out / f"wheels-{key}"
    if (cache / ".done").exists():
        log(f"dependency wheels: cached in {cache.name}")
        return cache
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    for name, text in sets.items():
        (cache / name).write_text(text)
    log("dependency wheels: downloading and building (tpm2-pytss compiles against libtss2-dev)")
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    pip = (python, "-m", "pip")
    wheel = ("wheel", "-q", "--require-hashes", "--no-deps", "-w", cache)
    run(*pip, *wheel, "--build-constraint", cache / BUILD, "-r", cache / RUNTIME, env=env)
    run(*pip, "download", "-q", "--require-hashes", "--no-deps", "-d", cache, "-r", cache / PIP, env=env)
    for old in out.glob("wheels-*"):
        if old != cache:
            shutil.rmtree(old, ignore_errors=True)
    (cache / ".done").touch()
    return cache


def nodegate_wheel(python: str, epoch: str, out: Path) -> Path:
    """Built from the tracked files only, in a copy (so no stale build/ or egg-info leaks in)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    files = git("ls-files", "-z", "--", *WHEEL_SOURCES)
    with tempfile.TemporaryDirectory(prefix="nodegate-src-") as tmp:
        for rel in filter(None, files.split("\0")):
            dst = Path(tmp) / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dst)
        env = {**os.environ, "SOURCE_DATE_EPOCH": epoch, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        run(python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, tmp, env=env)
    (wheel,) = out.glob("nodegate-*.whl")
    lockfile.node_requirements(wheel)
    return wheel


def debian_rootfs(rootfs: Path, epoch: str) -> None:
    shutil.rmtree(rootfs, ignore_errors=True)
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    mirror = str(sources) if sources.exists() else "/etc/apt/sources.list"
    cmd = [
        "mmdebstrap",
        "--mode=root",
        "--variant=essential",
        "--format=directory",
        "--aptopt=APT::Install-Recommends false",
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        *(f"--dpkgopt={o}" for o in DPKG_EXCLUDES),
        "--include=" + ",".join(DEBS),
        SUITE,
        str(rootfs),
        mirror,
    ]
    run(*cmd, env={**os.environ, "SOURCE_DATE_EPOCH": epoch}, stdout=subprocess.DEVNULL)


def install_nodegate(rootfs: Path, wheels: Path, wheel: Path) -> None:
    stage = rootfs / STAGE.lstrip("/")
    shutil.copytree(wheels, stage)
    shutil.copy2(wheel, stage)
    (pip_whl,) = stage.glob("pip-*.whl")
    requirements = lockfile.node_requirements_path(wheel)
    chroot = [
        "chroot",
        str(rootfs),
        "/usr/bin/env",
        "-i",
        "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG=C.UTF-8",
    ]
    chroot.append("PYTHONDONTWRITEBYTECODE=1")  # only compileall below writes bytecode
    run(*chroot, "/usr/bin/python3", "-m", "venv", "--without-pip", VENV)
    # The wheel itself too, for nodes: `podman cp` it out, or an init container hands it out
    # (docs/node-join.md, "Installing nodegate on a machine").
    (rootfs / WHEEL_DIR.lstrip("/")).mkdir(parents=True, exist_ok=True)
    shutil.copy2(wheel, rootfs / WHEEL_DIR.lstrip("/") / wheel.name)
    shutil.copy2(requirements, rootfs / WHEEL_DIR.lstrip("/") / requirements.name)
    run(
        *chroot,
        f"{VENV}/bin/python3",
        f"{STAGE}/{pip_whl.name}/pip",
        *("install", "-q", "--no-index", "--find-links", STAGE, "--no-compile", "--no-cache-dir"),
        *("--disable-pip-version-check", "--root-user-action=ignore", "--no-warn-script-location"),
        # The wheels were checked against the lock's hashes when they were fetched; here the
        # lock's versions, exactly (tpm2-pytss's wheel was built here, so it has no locked hash).
        *("-c", f"{STAGE}/{PINS}"),
        f"{STAGE}/{wheel.name}",
    )
    # Nothing nodegate needs is missing (stdout carries build.json only: pip's verdict to stderr).
    pip_check = ("check", "--disable-pip-version-check")
    run(*chroot, f"{VENV}/bin/python3", f"{STAGE}/{pip_whl.name}/pip", *pip_check, stdout=sys.stderr)
    # Every .py file gets an unchecked-hash .pyc (stdlib and venv alike): no timestamps inside, and
    # no attempt to rewrite them on a read-only root. Debian's timestamp .pyc files go first.
    for pyc in [*rootfs.glob("usr/lib/python3*/**/__pycache__"), *rootfs.glob("opt/nodegate/**/__pycache__")]:
        shutil.rmtree(pyc, ignore_errors=True)
    run(
        *chroot,
        f"{VENV}/bin/python3",
        *("-m", "compileall", "-f", "-q", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash"),
        "/usr/lib/python3.11",
        VENV,
    )


def vendor_roots(rootfs: Path, epoch: str) -> list[str]:
    """The vendor EK root store: the package's certificate folder, checked file by file against the
    committed table (names and SHA-256), into IMAGE_STORE. Returns the files copied."""
    sys.path.insert(0, str(REPO))
    from bootstrap.service.join import vendorroots  # noqa: PLC0415  (the checkout's table)

    with tempfile.TemporaryDirectory(prefix="nodegate-ek-roots-") as tmp:
        run(
            "apt-get", "download", "-q", f"{vendorroots.PACKAGE}={vendorroots.VERSION}",
            cwd=tmp, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        (deb,) = Path(tmp).glob("*.deb")
        run("dpkg-deb", "-x", deb, Path(tmp) / "x")
        source = Path(tmp) / "x" / vendorroots.PACKAGE_DIR
        target = rootfs / str(vendorroots.IMAGE_STORE).lstrip("/")
        target.mkdir(parents=True)
        copied = []
        for entry in vendorroots.FILES:
            data = vendorroots.check_file(source, entry)  # a file that differs stops the build
            dst = target / entry.file
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)
            copied.append(entry.file)
        extra = vendorroots.unlisted(source)
        if extra:
            raise SystemExit(f"image: {vendorroots.PACKAGE} has files the table does not list: {extra}")
        doc = rootfs / "usr/share/doc" / vendorroots.PACKAGE
        doc.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(tmp) / "x/usr/share/doc" / vendorroots.PACKAGE / "copyright", doc / "copyright")
    for path in [target, *target.rglob("*"), doc, doc / "copyright"]:
        os.utime(path, (int(epoch), int(epoch)), follow_symlinks=False)
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copied


def locked_versions(site: Path) -> None:
    """Every Python package in the image is in the lock at the lock's version (the SBOM lists
    them); `pip check` in install_nodegate has shown that none is missing."""
    locked = lockfile.pins(lockfile.export("runtime", hashes=False))
    locked[lockfile.normalise("nodegate")] = inputs()["version"]
    found = {lockfile.normalise(p["name"]): p["version"] for p in sbom.python_packages(site)}
    wrong = sorted(
        f"{n}=={v} (locked: {locked.get(n, 'absent')})" for n, v in found.items() if locked.get(n) != v
    )
    if wrong:
        raise SystemExit(f"image: Python packages that are not the locked ones: {', '.join(wrong)}")


def scrub(rootfs: Path) -> None:
    for pattern in LEFTOVERS:
        for path in rootfs.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    (rootfs / "tmp").chmod(0o1777)


def build(out: Path, python: str) -> dict[str, object]:
    t0 = time.monotonic()
    info = inputs()
    epoch = info["epoch"]
    out.mkdir(parents=True, exist_ok=True)
    wheels = dependency_wheels(python, out)
    wheel = nodegate_wheel(python, epoch, out / "nodegate-wheel")
    t1 = time.monotonic()
    log("root file system: mmdebstrap (Debian " + SUITE + ")")
    rootfs = out / "rootfs"
    debian_rootfs(rootfs, epoch)
    log("installing nodegate into " + VENV)
    install_nodegate(rootfs, wheels, wheel)
    log("vendor EK roots: Debian's ruby-tpm-key-attestation, checked against the committed table")
    vendor_roots(rootfs, epoch)
    from bootstrap.service.join import vendorroots  # noqa: PLC0415  (vendor_roots put the checkout on sys.path)

    ek_deb = {
        "name": vendorroots.PACKAGE,
        "version": vendorroots.VERSION,
        "arch": "all",
        "source": vendorroots.PACKAGE,
    }
    scrub(rootfs)
    name = f"{IMAGE_NAME}:{info['version']}"
    created = oci._rfc3339(int(epoch))
    site = next(rootfs.glob("opt/nodegate/lib/python3*/site-packages"))
    locked_versions(site)
    doc = sbom.dump(sbom.spdx(rootfs, site, name, created, [ek_deb]))
    (rootfs / SBOM_PATH).parent.mkdir(parents=True, exist_ok=True)
    (rootfs / SBOM_PATH).write_bytes(doc)
    (out / "sbom.spdx.json").write_bytes(doc)
    t2 = time.monotonic()
    log("packing the OCI layout and the docker archive")
    labels = {
        "org.opencontainers.image.title": "nodegate",
        "org.opencontainers.image.description": DESCRIPTION,
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.version": info["version"],
        "org.opencontainers.image.revision": info["revision"],
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.ref.name": info["version"],
    }
    cfg = oci.ImageConfig(
        created=int(epoch),
        user=USER,
        entrypoint=ENTRYPOINT,
        cmd=CMD,
        env=ENV,
        labels=labels,
        history=[
            f"mmdebstrap --variant=essential {SUITE} --include={','.join(DEBS)}",
            f"python3 -m venv {VENV}; pip install nodegate=={info['version']} (uv.lock)",
            "ruby-tpm-key-attestation's EK root CAs (dpkg-deb -x) -> /usr/share/nodegate/ek-roots",
        ],
    )
    shutil.rmtree(out / "oci", ignore_errors=True)
    manifest = oci.write_layout(rootfs, out, cfg, info["version"], name, sbom=doc)
    t3 = time.monotonic()
    files = (p.lstat() for p in rootfs.rglob("*") if p.is_file() and not p.is_symlink())
    inodes = {(st.st_dev, st.st_ino): st.st_size for st in files}
    size = sum(inodes.values())  # hard links once, as in the layer
    written = json.loads(oci.Blobs(out / "oci").path(manifest).read_bytes())
    layer, config_digest = written["layers"][0], written["config"]["digest"]
    result: dict[str, object] = {
        "name": name,
        "digest": manifest["digest"],
        # the image ID podman/docker show after loading the tar (the manifest digest is not kept)
        "image_id": config_digest,
        "revision": info["revision"],
        "source_date_epoch": int(epoch),
        "uncompressed_bytes": size,
        "compressed_bytes": layer["size"],
        "seconds": {
            "wheels": round(t1 - t0, 1),
            "rootfs": round(t2 - t1, 1),
            "pack": round(t3 - t2, 1),
            "total": round(t3 - t0, 1),
        },
        "archive": str(out / f"nodegate-{info['version']}.tar"),
        "layout": str(out / "oci"),
    }
    (out / "build.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="default build/image (build/wheel)")
    parser.add_argument("--python", default=sys.executable, help="builds the wheels (needs pip)")
    parser.add_argument(
        "--wheel-only",
        action="store_true",
        help="only nodegate's wheel, from the tracked files (make wheel; no root needed)",
    )
    args = parser.parse_args()
    if args.wheel_only:
        out = (args.out or REPO / "build" / "wheel").resolve()
        wheel = nodegate_wheel(args.python, inputs()["epoch"], out)
        print(wheel)
        return 0
    args.out = args.out or REPO / "build" / "image"
    if os.geteuid() != 0:
        log("needs root (mmdebstrap --mode=root, chroot): run it with sudo")
        return 2
    if shutil.which("mmdebstrap") is None:
        log("mmdebstrap is missing: `make image-deps` installs it")
        return 2
    result = build(args.out.resolve(), args.python)
    mb = int(result["uncompressed_bytes"]) / 1e6  # type: ignore[call-overload]
    log(f"{result['name']} {result['digest']}: {mb:.1f} MB uncompressed, {result['seconds']} s")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
