"""The one lock: uv.lock holds every Python package any install of nodegate gets (runtime, the
demo, spire and test extras, the lint tools, the pip that builds the image), with hashes. This
script is the only way the Makefile, the image build and the wheel read it
(docs/development.md, "One lock").

  lockfile.py uv            print uv's path; installs the pinned uv (tools/uv/requirements.txt,
                            pip's hash-checking mode) into ~/.cache/nodegate/uv/<version>/ first
  lockfile.py check [DIR]   exit 1 with one line naming `make lock` if uv.lock and pyproject.toml
                            disagree
  lockfile.py node-requirements WHEEL   write nodegate-<version>-requirements.txt beside the
                            wheel: the wheel by hash and its locked runtime dependencies
  lockfile.py export KIND   print a hashed requirements file from the lock: `runtime` (what
                            `pip install nodegate` needs), `pip` (the image's pip), `build` (the
                            build back-ends pinned in pyproject.toml, for pip's --build-constraint)

NODEGATE_CACHE moves the cache root, as for the other cached tools.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UV_PIN = REPO / "tools" / "uv" / "requirements.txt"
LOCK = REPO / "uv.lock"
# uv export's selections: no nodegate itself (its wheel is installed next to these, --no-deps).
EXPORTS = {
    "runtime": ["--no-default-groups"],
    "pip": ["--only-group", "image"],
}
STALE = "uv.lock does not match pyproject.toml: run `make lock` and commit uv.lock"


def uv_version() -> str:
    match = re.search(r"^uv==(\S+)", UV_PIN.read_text(), re.M)
    if match is None:
        raise SystemExit(f"lockfile: {UV_PIN.relative_to(REPO)} pins no uv==VERSION")
    return match.group(1)


def uv_path() -> Path:
    """The pinned uv, installed on first use (a temporary folder renamed into place, so an
    interrupted install is never taken for a finished one)."""
    cache = Path(os.environ.get("NODEGATE_CACHE") or Path.home() / ".cache" / "nodegate") / "uv"
    home = cache / uv_version()
    binary = home / "bin" / "uv"
    if binary.exists():
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".uv-", dir=cache, ignore_cleanup_errors=True) as tmp:
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps"),
                *("--require-hashes", "--root-user-action=ignore", "--target", tmp, "-r", str(UV_PIN)),
            ],
            check=True,
        )
        os.replace(tmp, home)
    return binary


def uv(*args: str, project: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"}
    return subprocess.run(
        [str(uv_path()), *args, "--project", str(project)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


def check(project: Path = REPO) -> bool:
    """True when the lock satisfies pyproject.toml (uv decides offline from the lock alone)."""
    return uv("lock", "--check", "--offline", project=project).returncode == 0


def build_constraints() -> str:
    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["uv"]["build-constraint-dependencies"]
    return "".join(f"{pin}\n" for pin in pins)


@functools.cache  # one uv run per selection: the image build asks for the runtime set three times
def export(kind: str, *, hashes: bool = True) -> str:
    if kind == "build":
        return build_constraints()
    done = uv(
        "export",
        "--frozen",
        "--format",
        "requirements-txt",
        "--no-emit-project",
        "--no-header",
        "--no-annotate",
        *([] if hashes else ["--no-hashes"]),
        *EXPORTS[kind],
    )
    if done.returncode != 0:
        raise SystemExit(f"lockfile: uv export {kind} failed: {done.stderr.strip()}")
    return done.stdout


def node_requirements_path(wheel: Path) -> Path:
    return wheel.with_name(f"nodegate-{wheel.name.split('-')[1]}-requirements.txt")


def node_requirements(wheel: Path) -> Path:
    """``nodegate-<version>-requirements.txt`` beside the wheel: the wheel by its hash and every
    runtime dependency as uv.lock pins it, hashed, so that a node installs what was tested with
    one ``pip install --require-hashes -r`` (docs/node-join.md)."""
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    target = node_requirements_path(wheel)
    target.write_text(
        f"# {wheel.name} and its dependencies as tested (uv.lock), hashed. In the folder that\n"
        f"# holds both files: pip install --require-hashes -r {target.name}\n"
        f"./{wheel.name} --hash=sha256:{digest}\n" + export("runtime")
    )
    return target


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(requirements: str) -> dict[str, str]:
    """name -> version of an exported requirements file (every line of uv's export is ``==``)."""
    out = {}
    for line in requirements.splitlines():
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line)
        if match:
            out[normalise(match.group(1))] = match.group(2)
    return out


def main(argv: list[str]) -> int:
    match argv:
        case ["uv"]:
            print(uv_path())
        case ["check", *project] if len(project) <= 1:
            if not check(Path(*project) if project else REPO):
                print(f"lockfile: {STALE}", file=sys.stderr)
                return 1
        case ["export", kind] if kind in (*EXPORTS, "build"):
            sys.stdout.write(export(kind))
        case ["node-requirements", wheel]:
            print(node_requirements(Path(wheel)))
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
