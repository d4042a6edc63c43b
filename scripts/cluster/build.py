#!/usr/bin/env python3
"""Build the real control plane's binaries from their Go modules, cached by version (issue 36).

    python3 scripts/cluster/build.py            build what is missing, print how long each took
    python3 scripts/cluster/build.py --gomod    regenerate tools/cluster/<tool>/go.mod + go.sum
    python3 scripts/cluster/build.py --print-dir TOOL   the cache folder of one tool

Pins: tools/cluster/versions.env. Each tool has its own small module under tools/cluster/<tool>/
(so their dependency sets never collide); the committed go.mod/go.sum make the build
reproducible, and `go build -mod=readonly` refuses to drift from them. `go install pkg@version`
cannot be used: k8s.io/kubernetes needs one `replace` per staging module, which we generate
from its own go.mod (every `k8s.io/<m> v0.0.0` line -> `k8s.io/<m> v0.<minor>.<patch>`).

Binaries land in ~/.cache/nodegate/<tool>/<pin>/<tool> (NODEGATE_CLUSTER_CACHE overrides the
root), with a stamp holding the hash of the go.mod/go.sum they were built from: a changed
module rebuilds, an unchanged one is reused.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools" / "cluster"


@dataclass(frozen=True)
class Tool:
    name: str
    module: str
    package: str
    pin_key: str

    def ldflags(self, pin: str) -> list[str]:
        if self.module == "k8s.io/kubernetes":
            major, minor = pin.lstrip("v").split(".")[:2]
            pairs = {
                "gitVersion": pin,
                "gitMajor": major,
                "gitMinor": minor,
                "gitTreeState": "clean",
                "buildDate": "1970-01-01T00:00:00Z",
            }
            return [
                f"-X k8s.io/{pkg}/version.{k}={v}"
                for pkg in ("client-go/pkg", "component-base")
                for k, v in pairs.items()
            ]
        if self.module == "sigs.k8s.io/kwok":
            return [f"-X sigs.k8s.io/kwok/pkg/consts.Version={pin.lstrip('v')}"]
        return []


ALL = [
    Tool("etcd", "go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/server/v3", "ETCD_VERSION"),
    Tool(
        "kube-apiserver",
        "k8s.io/kubernetes",
        "k8s.io/kubernetes/cmd/kube-apiserver",
        "KUBERNETES_VERSION",
    ),
    Tool(
        "kube-controller-manager",
        "k8s.io/kubernetes",
        "k8s.io/kubernetes/cmd/kube-controller-manager",
        "KUBERNETES_VERSION",
    ),
    Tool("kwok", "sigs.k8s.io/kwok", "sigs.k8s.io/kwok/cmd/kwok", "KWOK_VERSION"),
    # The client the tests apply CRs with: the machine's kubectl (Debian's is 1.20, Google's apt
    # repository's another version) is outside the +-1 skew of the pinned API server.
    Tool("kubectl", "k8s.io/kubernetes", "k8s.io/kubernetes/cmd/kubectl", "KUBERNETES_VERSION"),
]


def pins() -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in (TOOLS / "versions.env").read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def cache_root() -> Path:
    env = os.environ.get("NODEGATE_CLUSTER_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "nodegate"


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CGO_ENABLED", "0")
    env["GOFLAGS"] = "-buildvcs=false"
    return env


def go(args: list[str], cwd: Path) -> str:
    proc = subprocess.run(["go", *args], cwd=cwd, env=go_env(), capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"go {' '.join(args)} failed in {cwd}")
    return proc.stdout


def staging_replaces(module: str, version: str) -> list[str]:
    """One replace per staging module the downloaded go.mod requires at v0.0.0."""
    gomod = Path(
        go(["mod", "download", "-json", f"{module}@{version}"], cwd=Path(tempfile.gettempdir()))
        .split('"GoMod": "')[1]
        .split('"')[0]
    )
    minor_patch = ".".join(version.lstrip("v").split(".")[1:3])
    names = re.findall(r"^\s*(k8s\.io/[\w.-]+) v0\.0\.0$", gomod.read_text(), re.MULTILINE)
    if not names:
        raise SystemExit(f"{module}@{version}: no staging modules at v0.0.0 in its go.mod")
    return [f"-replace={m}={m}@v0.{minor_patch}" for m in sorted(set(names))]


def regen_gomod(tool: Tool, pin: str) -> None:
    d = TOOLS / tool.name
    d.mkdir(parents=True, exist_ok=True)
    for f in ("go.mod", "go.sum"):
        (d / f).unlink(missing_ok=True)
    go(["mod", "init", f"nodegate.local/tools/cluster/{tool.name}"], cwd=d)
    if tool.module == "k8s.io/kubernetes":
        go(["mod", "edit", *staging_replaces(tool.module, pin)], cwd=d)
    go(["get", "-tool", f"{tool.package}@{pin}"], cwd=d)
    go(["mod", "tidy"], cwd=d)
    print(f"{tool.name}: tools/cluster/{tool.name}/go.mod regenerated for {pin}", flush=True)


def stamp_of(tool: Tool) -> str:
    h = hashlib.sha256()
    for f in ("go.mod", "go.sum"):
        h.update((TOOLS / tool.name / f).read_bytes())
    return h.hexdigest()


def out_dir(tool: Tool, pin: str) -> Path:
    return cache_root() / tool.name / pin


# kwok's own stage files (read by tests/cluster/plane.py), copied from its module next to the
# binary so that the tests need neither Go nor the module cache.
KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat/node-heartbeat.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)


def build(tool: Tool, pin: str) -> None:
    d = out_dir(tool, pin)
    d.mkdir(parents=True, exist_ok=True)
    # One builder per tool and pin at a time (two worktrees running `make cluster`): the second
    # waits, then finds the binary cached.
    with (d / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _build_locked(tool, pin, d)
        if tool.name == "kwok":
            _copy_stages(tool, pin, d)


def _copy_stages(tool: Tool, pin: str, d: Path) -> None:
    out = go(["mod", "download", "-json", f"{tool.module}@{pin}"], cwd=TOOLS / tool.name)
    module_dir = Path(out.split('"Dir": "')[1].split('"')[0])
    for rel in KWOK_STAGES:
        dest = d / "stages" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(module_dir / rel, dest)


def _build_locked(tool: Tool, pin: str, d: Path) -> None:
    binary, stamp = d / tool.name, d / "stamp"
    want = stamp_of(tool)
    if binary.exists() and stamp.exists() and stamp.read_text().strip() == want:
        print(f"{tool.name} {pin}: cached at {binary}", flush=True)
        return
    start = time.monotonic()
    tmp = d / f".{tool.name}.tmp"
    ldflags = " ".join(["-s", "-w", *tool.ldflags(pin)])
    print(f"{tool.name} {pin}: building (cold builds take minutes) ...", flush=True)
    go(
        ["build", "-mod=readonly", "-trimpath", f"-ldflags={ldflags}", "-o", str(tmp), tool.package],
        cwd=TOOLS / tool.name,
    )
    os.replace(tmp, binary)
    stamp.write_text(want + "\n")
    took = time.monotonic() - start
    print(f"{tool.name} {pin}: built in {took:.0f} s -> {binary}", flush=True)
    with (cache_root() / "build-times.log").open("a") as log:
        log.write(
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {tool.name} {pin} {took:.0f}s "
            f"load={os.getloadavg()[0]:.1f}\n"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--gomod", action="store_true", help="regenerate the go.mod/go.sum files")
    ap.add_argument("--print-dir", metavar="TOOL", help="print one tool's cache folder and exit")
    ap.add_argument("tools", nargs="*", help="only these tools (default: all)")
    args = ap.parse_args()
    if shutil.which("go") is None:
        raise SystemExit("go is not installed (Debian: golang-go; issue 36 used Go 1.26)")
    p = pins()
    selected = [t for t in ALL if not args.tools or t.name in args.tools]
    if args.print_dir:
        tool = next(t for t in ALL if t.name == args.print_dir)
        print(out_dir(tool, p[tool.pin_key]))
        return 0
    total = time.monotonic()
    for tool in selected:
        if args.gomod:
            regen_gomod(tool, p[tool.pin_key])
        else:
            build(tool, p[tool.pin_key])
    print(f"cluster binaries ready ({time.monotonic() - total:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
