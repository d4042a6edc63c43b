"""A real Kubernetes control plane on 127.0.0.1 for tests and benchmarks (envtest-like, issue 36):
etcd, kube-apiserver, kube-controller-manager and kwok, built by ``make cluster``
(scripts/cluster/build.py) into ~/.cache/nodegate/<tool>/<pin>/. Nothing listens beyond loopback.

    plane = ControlPlane.start(folder)      # about 10-30 s warm
    plane.kubectl("get", "nodes")
    plane.stop()                            # every process by its PID; logs stay in folder

Also runnable by hand (docs/development.md): ``python -m tests.cluster.plane [--keep]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from tests.cluster.pki import ClusterCa, service_account_key

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("etcd", "kube-apiserver", "kube-controller-manager", "kwok", "kubectl")
PIN_KEYS = {
    "etcd": "ETCD_VERSION",
    "kube-apiserver": "KUBERNETES_VERSION",
    "kube-controller-manager": "KUBERNETES_VERSION",
    "kubectl": "KUBERNETES_VERSION",
    "kwok": "KWOK_VERSION",
}
START_TIMEOUT = 60.0
REQUIRE_ENV = "NODEGATE_REQUIRE_CLUSTER"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# A client-certificate user whose lists and watches the API server writes to its audit log
# (folder/audit.log; ControlPlane.audit): what a test counts of one client's requests, as the
# server saw them. Nobody else is audited.
AUDITED_USER = "nodegate-audited"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "users": [AUDITED_USER], "verbs": ["list", "watch"]},
        {"level": "None"},
    ],
}
# Test users of the token authenticator: token -> (user, uid, groups).
TOKEN_USERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "deployer": ("alice", "uid-alice", ("team-gpu",)),
    "outsider": ("bob", "uid-bob", ("team-web",)),
    "rebooter": ("carol", "uid-carol", ("team-gpu", "gpu-admins")),
    "scraper": ("prometheus", "uid-prometheus", ("monitoring",)),
}


def pins() -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in (ROOT / "tools" / "cluster" / "versions.env").read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def cache_root() -> Path:
    env = os.environ.get("NODEGATE_CLUSTER_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "nodegate"


def binary(tool: str) -> Path:
    return cache_root() / tool / pins()[PIN_KEYS[tool]] / tool


def missing_binaries() -> list[str]:
    missing = [t for t in TOOLS if not binary(t).is_file()]
    if "kwok" not in missing and not all((kwok_stage_dir() / rel).is_file() for rel in KWOK_STAGE_FILES):
        missing.append("kwok's stage files")
    return missing


def required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PlaneError(RuntimeError):
    """A component did not start; the message names it and its log file."""


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    _out: TextIO

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        self._out.close()

    def rss_kib(self) -> int:
        """Resident set size now (VmRSS), 0 when the process is gone."""
        try:
            for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def spawn(name: str, argv: list[str], folder: Path, env: dict[str, str] | None = None) -> Proc:
    log = folder / f"{name}.log"
    out = log.open("a")
    popen = subprocess.Popen(
        argv,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    (folder / f"{name}.pid").write_text(f"{popen.pid}\n")
    return Proc(name, popen, log, out)


@dataclass
class ControlPlane:
    folder: Path
    ca: ClusterCa
    api_port: int
    etcd_port: int
    admin_kubeconfig: Path
    procs: dict[str, Proc] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def audited(self) -> list[dict[str, Any]]:
        """One entry per request in the audit log (start(audit_users=...), and AUDITED_USER's lists
        and watches): its verb, resource, subresource, user and when it was received (RFC 3339,
        microseconds)."""
        out: dict[str, dict[str, Any]] = {}
        for ev in self.audit():
            ref = ev.get("objectRef") or {}
            out.setdefault(
                ev["auditID"],
                {
                    "verb": ev.get("verb"),
                    "resource": ref.get("resource"),
                    "subresource": ref.get("subresource"),
                    "user": (ev.get("user") or {}).get("username"),
                    "received": ev.get("requestReceivedTimestamp"),
                },
            )
        return list(out.values())

    # ---- start -------------------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        folder: Path,
        *,
        kwok: bool = True,
        heartbeat_ms: tuple[int, int] | None = None,
        node_grace_s: int | None = None,
        audit_users: tuple[str, ...] = (),
    ) -> ControlPlane:
        """``audit_users``: the API server also logs every request of these users (its audit log
        at Metadata level, read by ``audit`` and ``audited``)."""
        folder.mkdir(parents=True, exist_ok=True)
        pki = folder / "pki"
        pki.mkdir(exist_ok=True)
        ca = ClusterCa.create(pki)
        plane = cls(folder, ca, free_port(), free_port(), folder / "admin.kubeconfig")
        try:
            plane._start_all(
                pki, kwok=kwok, heartbeat_ms=heartbeat_ms, node_grace_s=node_grace_s, audit_users=audit_users
            )
        except BaseException:
            plane.stop()
            raise
        return plane

    def _start_all(
        self,
        pki: Path,
        *,
        kwok: bool,
        heartbeat_ms: tuple[int, int] | None,
        node_grace_s: int | None,
        audit_users: tuple[str, ...],
    ) -> None:
        began = time.monotonic()
        self._start_etcd()
        self.timings["etcd"] = time.monotonic() - began
        self._start_apiserver(pki, audit_users)
        self.timings["kube-apiserver"] = time.monotonic() - began - self.timings["etcd"]
        t = time.monotonic()
        self._start_controller_manager(pki, node_grace_s)
        if kwok:
            self._start_kwok(heartbeat_ms)
        self.timings["controllers"] = time.monotonic() - t
        self.timings["total"] = time.monotonic() - began

    def _start_etcd(self) -> None:
        peer = free_port()
        data = self.folder / "etcd-data"
        argv = [
            str(binary("etcd")),
            f"--data-dir={data}",
            f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--listen-metrics-urls=",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]
        self.procs["etcd"] = spawn("etcd", argv, self.folder)
        self._wait("etcd", lambda: _http_ok(f"http://127.0.0.1:{self.etcd_port}/health"))

    def _start_apiserver(self, pki: Path, audit_users: tuple[str, ...] = ()) -> None:
        serving = self.ca.issue(pki, "apiserver", "kube-apiserver", server=True)
        sa_pub, sa_key = service_account_key(pki)
        tokens = pki / "tokens.csv"
        tokens.write_text(
            "".join(
                f'{tok},{user},{uid},"{",".join(groups)}"\n'
                for tok, (user, uid, groups) in TOKEN_USERS.items()
            )
        )
        argv = [
            str(binary("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.api_port}",
            # Without it the server looks for a default route to advertise, which a sandbox lacks.
            "--advertise-address=127.0.0.1",
            f"--tls-cert-file={serving[0]}",
            f"--tls-private-key-file={serving[1]}",
            f"--client-ca-file={self.ca.cert_file}",
            f"--token-auth-file={tokens}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            # No serviceaccount controller runs to create each namespace's default account.
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--endpoint-reconciler-type=none",
            f"--cert-dir={pki}",
            f"--audit-policy-file={self._audit_policy(audit_users)}",
            f"--audit-log-path={self.folder / 'audit.log'}",
            "--audit-log-format=json",
            "--profiling=false",
            "--v=1",
        ]
        self.procs["kube-apiserver"] = spawn("kube-apiserver", argv, self.folder)
        admin = self.ca.issue(pki, "admin", "nodegate-test-admin", orgs=("system:masters",))
        self.write_kubeconfig(self.admin_kubeconfig, cert=admin)
        ctx = self.ssl_context(admin)
        self._wait("kube-apiserver", lambda: _http_ok(f"{self.url}/readyz", ctx))

    def _audit_policy(self, audit_users: tuple[str, ...]) -> Path:
        policy = dict(AUDIT_POLICY)
        if audit_users:  # every request of these users, before the rule that drops the rest
            rules = list(policy["rules"])
            policy["rules"] = [*rules[:-1], {"level": "Metadata", "users": list(audit_users)}, rules[-1]]
        path = self.folder / "audit-policy.yaml"
        path.write_text(yaml.safe_dump(policy))
        return path

    def _start_controller_manager(self, pki: Path, node_grace_s: int | None = None) -> None:
        kcm = self.ca.issue(pki, "kcm", "system:kube-controller-manager")
        kubeconfig = self.write_kubeconfig(self.folder / "kcm.kubeconfig", cert=kcm)
        argv = [
            str(binary("kube-controller-manager")),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--controllers=job-controller,garbage-collector-controller,ttl-after-finished-controller,"
            "namespace-controller,certificatesigningrequest-signing-controller,"
            "certificatesigningrequest-approving-controller,certificatesigningrequest-cleaner-controller,"
            "node-lifecycle-controller",
            f"--cluster-signing-cert-file={self.ca.cert_file}",
            f"--cluster-signing-key-file={self.ca.key_file}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            # Each controller as its own service account (kubeadm's setup): the bootstrap RBAC
            # grants system:kube-controller-manager itself little; the node lifecycle controller
            # is then system:serviceaccount:kube-system:node-controller, whom the chart exempts.
            "--use-service-account-credentials=true",
            *(
                # How soon a silent Node counts as unreachable (defaults 50 s and 60 s).
                [
                    f"--node-monitor-grace-period={node_grace_s}s",
                    f"--node-startup-grace-period={node_grace_s}s",
                    "--node-monitor-period=2s",
                ]
                if node_grace_s is not None
                else []
            ),
            "--v=1",
        ]
        self.procs["kube-controller-manager"] = spawn("kube-controller-manager", argv, self.folder)

    def _start_kwok(self, heartbeat_ms: tuple[int, int] | None) -> None:
        stages = self.folder / "kwok-stages.yaml"
        stages.write_text(kwok_stages(heartbeat_ms))
        argv = [
            str(binary("kwok")),
            f"--kubeconfig={self.admin_kubeconfig}",
            f"--config={stages}",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            "--cidr=10.244.0.0/16",
            "--node-ip=127.0.0.2",
            f"--server-address=127.0.0.1:{free_port()}",
        ]
        self.procs["kwok"] = spawn("kwok", argv, self.folder)

    def _wait(self, name: str, ready: Any) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        proc = self.procs[name]
        while time.monotonic() < deadline:
            if not proc.alive():
                raise PlaneError(f"{name} exited ({proc.popen.returncode}); log {proc.log}:\n{proc.tail()}")
            if ready():
                return
            time.sleep(0.2)
        raise PlaneError(f"{name} not ready within {START_TIMEOUT:.0f} s; log {proc.log}:\n{proc.tail()}")

    # ---- clients -----------------------------------------------------------------------------
    def ssl_context(self, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca.cert_file))
        if cert is not None:
            ctx.load_cert_chain(*cert)
        return ctx

    def write_kubeconfig(
        self, path: Path, *, cert: tuple[Path, Path] | None = None, token: str | None = None
    ) -> Path:
        user: dict[str, str] = {}
        if cert is not None:
            user = {"client-certificate": str(cert[0]), "client-key": str(cert[1])}
        if token is not None:
            user = {"token": token}
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca.cert_file)},
                }
            ],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "u"}}],
            "current-context": "test",
        }
        path.write_text(yaml.safe_dump(doc))
        path.chmod(0o600)
        return path

    def token_kubeconfig(self, token: str) -> Path:
        return self.write_kubeconfig(self.folder / f"token-{token}.kubeconfig", token=token)

    def cert_kubeconfig(self, cn: str, orgs: tuple[str, ...] = ()) -> Path:
        stem = cn.replace(":", "_")
        cert = self.ca.issue(self.folder / "pki", stem, cn, orgs=orgs)
        return self.write_kubeconfig(self.folder / f"cert-{stem}.kubeconfig", cert=cert)

    def cert_context(self, cn: str) -> ssl.SSLContext:
        """The TLS context of a client certificate ``cert_kubeconfig`` issued (for raw requests)."""
        stem = cn.replace(":", "_")
        pki = self.folder / "pki"
        return self.ssl_context((pki / f"{stem}.crt", pki / f"{stem}.key"))

    def kubectl(
        self, *args: str, kubeconfig: Path | None = None, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(binary("kubectl")), f"--kubeconfig={kubeconfig or self.admin_kubeconfig}", *args]
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120, check=False)
        if check and proc.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.returncode}\n{proc.stdout}{proc.stderr}")
        return proc

    def apply(self, docs: list[dict[str, Any]] | dict[str, Any]) -> None:
        items = docs if isinstance(docs, list) else [docs]
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump_all(items)
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        ctx: ssl.SSLContext | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """One raw API call as admin (or with ``ctx``): (status, decoded JSON body)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method)  # noqa: S310
        req.add_header("Content-Type", (headers or {}).pop("Content-Type", "application/json"))
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        admin = (self.folder / "pki" / "admin.crt", self.folder / "pki" / "admin.key")
        try:
            with urllib.request.urlopen(req, context=ctx or self.ssl_context(admin), timeout=30) as resp:  # noqa: S310
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    # ---- observe / stop ----------------------------------------------------------------------
    def audit(self) -> list[dict[str, Any]]:
        """The audit events so far: AUDITED_USER's lists and watches (a watch is logged when its
        response starts, stage ResponseStarted, and again when it ends)."""
        try:
            text = (self.folder / "audit.log").read_text()
        except FileNotFoundError:
            return []
        # The last line may be half written: only whole lines count.
        return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]

    def rss_kib(self) -> dict[str, int]:
        return {name: p.rss_kib() for name, p in self.procs.items()}

    def logs(self) -> dict[str, Path]:
        return {name: p.log for name, p in self.procs.items()}

    def stop(self) -> None:
        # Reverse start order: nothing keeps writing to a server that is already gone.
        for name in reversed(list(self.procs)):
            self.procs[name].stop()


def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:  # noqa: S310
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def kwok_stage_dir() -> Path:
    """Where `make cluster` copied kwok's stage files from its module (next to the binary)."""
    return binary("kwok").parent / "stages"


# kwok's own stage files (from its module, never committed; scripts/cluster/build.py copies them):
# node initialize and heartbeat, pods Ready then Complete, and deletion.
KWOK_STAGE_FILES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat/node-heartbeat.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)


def kwok_stages(heartbeat_ms: tuple[int, int] | None = None) -> str:
    """kwok's stages concatenated; ``heartbeat_ms`` (delay, jitter) replaces the heartbeat stage's
    20-45 s so that a short test sees many kubelet-like status updates."""
    folder = kwok_stage_dir()
    parts = []
    for rel in KWOK_STAGE_FILES:
        path = folder / rel
        if not path.is_file():
            raise PlaneError(
                f"kwok stage {path} missing: run `make cluster` (it copies them from kwok's module)"
            )
        text = path.read_text().strip().removeprefix("---").strip()
        if heartbeat_ms is not None and rel.endswith("node-heartbeat.yaml"):
            doc = yaml.safe_load(text)
            doc["spec"]["delay"] = {
                "durationMilliseconds": heartbeat_ms[0],
                "jitterDurationMilliseconds": heartbeat_ms[0] + heartbeat_ms[1],
            }
            text = yaml.safe_dump(doc, sort_keys=False).strip()
        parts.append(text)
    return "\n---\n".join(parts) + "\n"


def main() -> int:
    """Start the control plane by hand and keep it until Ctrl-C (docs/development.md)."""
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description="a real control plane on 127.0.0.1 (issue 36)")
    ap.add_argument("--dir", type=Path, help="working folder (default: a fresh temporary one)")
    ap.add_argument("--no-kwok", action="store_true")
    args = ap.parse_args()
    missing = missing_binaries()
    if missing:
        print(f"missing {', '.join(missing)}: run `make cluster`", file=sys.stderr)
        return 2
    folder = args.dir or Path(tempfile.mkdtemp(prefix="nodegate-plane-"))
    # Blocked, so that sigwait below receives them and the processes are stopped (the default
    # SIGTERM action would end Python without stopping its children).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    plane = ControlPlane.start(folder, kwok=not args.no_kwok)
    print(f"control plane up in {plane.timings['total']:.1f} s at {plane.url}")
    print(f"  export KUBECONFIG={plane.admin_kubeconfig}")
    for name, log in plane.logs().items():
        print(f"  {name}: log {log}, pid {plane.procs[name].popen.pid}")
    print("Ctrl-C stops every process (the folder and its logs stay).")
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
