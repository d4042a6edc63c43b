"""`nodegate demo`: the whole story on one machine in well under a minute.

Real: the join service (`nodegate serve`, a subprocess on TLS with its own CA), `nodegate join`
(one subprocess per node), the attestation code, the hold gate (the `nodegate gate --once` pass)
and the admission webhook (the running service's, with a PackagePolicy and RBAC files: the same
decisions `nodegate policy test` makes). Emulated, and labelled so in the output: the TPMs
(swtpm, with swtpm_localca as the TPM vendor's CA), the Kubernetes API (kmock with
bootstrap/emulator.py, in this process on loopback, with a stand-in for the cluster's kubelet
client signer) and NodeWright's agent (the demo writes the package states it would write).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import hashlib
import json
import os
import re
import signal
import ssl
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bootstrap.demo import swtpm

if TYPE_CHECKING:
    from bootstrap.demo.emulator import ShimEmulator
    from bootstrap.kube import Kube

STEPS = 9
TRUST_DOMAIN = "demo.nodegate.test"
NODES = ("gpu-node-1", "gpu-node-2", "gpu-node-3")
TAMPERED = "gpu-node-4"
SELECTION = "sha256:0,1,2,3,4,5,6,7"
PCR_CLASS = "demo-fleet"
POOL = {"node-restriction.kubernetes.io/nodegate.io-pcr-class": PCR_CLASS}  # set by nodegate at join
CR_NAME = "gpu-stack"
CR_GROUP, CR_VERSION, CR_PLURAL = "nodewright.nvidia.com", "v1alpha1", "nodewrights"
PACKAGES = {"gpu-driver": "550.54.15", "ib-tuning": "1.2.0"}
TAINT_KEY = "nodegate.io/hold"
START_TIMEOUT = 30.0
JOIN_TIMEOUT = 60.0
TOTAL_TIMEOUT = 120.0
_INDENT = " " * 6


class DemoFailed(Exception):
    """A step did not turn out as the story says; the message is the one line printed."""


def _step(n: int, text: str) -> None:
    print(f"[{n}/{STEPS}] {text}", flush=True)


def _detail(text: str) -> None:
    print(f"{_INDENT}{text}", flush=True)


def _env() -> dict[str, str]:
    return {**os.environ, "TSS2_LOG": os.environ.get("TSS2_LOG", "all+none")}


def _nodegate(*args: str) -> tuple[str, ...]:
    # The interpreter running the demo, so a venv's nodegate is used even when it is not on PATH.
    return (sys.executable, "-m", "bootstrap.cli", *args)


# -- the emulated cluster ---------------------------------------------------------------------


def register_resources(emu: ShimEmulator) -> None:
    """What the demo's cluster serves (discovery); the package CRDs as NodeWright installs them."""
    import kmock  # noqa: PLC0415  (a test extra: only the demo and the tests load it)

    for path, kind, namespaced in (
        ("v1/nodes", "Node", False),
        ("v1/events", "Event", True),
        ("coordination.k8s.io/v1/leases", "Lease", True),
        ("certificates.k8s.io/v1/certificatesigningrequests", "CertificateSigningRequest", False),
        ("nodegate.io/v1alpha1/nodeattestations", "NodeAttestation", False),
        ("nodewright.nvidia.com/v1alpha1/nodewrights", "NodeWright", False),
        ("skyhook.nvidia.com/v1alpha1/skyhooks", "Skyhook", False),
    ):
        emu.resources[path] = kmock.ResourceInfo(kind=kind, namespaced=namespaced)


# -- what the demo deploys --------------------------------------------------------------------


def package_cr(**changes: Any) -> dict[str, Any]:
    """The NodeWright CR of the story: two packages for every node of the demo-fleet PCR class.
    ``changes`` replace spec keys, or (``package=...``) keys of the gpu-driver package."""
    packages = {
        name: {
            "version": version,
            "image": f"ghcr.io/nvidia/nodewright-packages/{name}",
            "containerSHA": "sha256:" + hashlib.sha256(f"{name}:{version}".encode()).hexdigest(),
            "interrupt": {"type": "service", "services": ["nvidia-persistenced"]},
        }
        for name, version in PACKAGES.items()
    }
    packages["gpu-driver"].update(changes.pop("package", {}))
    spec: dict[str, Any] = {
        "nodeSelectors": {"matchLabels": dict(POOL)},
        # The packages run on held nodes, so NodeWright's pods must tolerate the hold.
        "additionalTolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        "interruptionBudget": {"percent": 33},
        "packages": packages,
        **changes,
    }
    return {
        "apiVersion": f"{CR_GROUP}/{CR_VERSION}",
        "kind": "NodeWright",
        "metadata": {"name": CR_NAME},
        "spec": spec,
    }


def policy_documents() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "nodegate.io/v1alpha1",
            "kind": "PackagePolicy",
            "metadata": {"name": PCR_CLASS},
            "spec": {
                "nodeSelector": {"matchLabels": dict(POOL)},
                "images": {"registries": ["ghcr.io/nvidia"], "requireDigest": True},
                "interrupts": {"allowed": ["noop", "service", "reboot"]},
                "maxInterruptionBudget": {"percent": 50},
            },
        }
    ]


def rbac_documents() -> list[dict[str, Any]]:
    def role(verb: str) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{verb}-{PCR_CLASS}"},
            "rules": [
                {
                    "apiGroups": ["nodegate.io"],
                    "resources": ["packagepolicies"],
                    "resourceNames": [PCR_CLASS],
                    "verbs": [verb],
                }
            ],
        }

    def binding(role_name: str, group: str) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{group}-{role_name}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
        }

    return [
        role("deploy"),
        role("reboot"),
        binding(f"deploy-{PCR_CLASS}", "ml-platform"),  # alice's team deploys, but may not reboot
        binding(f"reboot-{PCR_CLASS}", "sre"),
    ]


def review(
    obj: dict[str, Any] | None,
    user: str,
    groups: tuple[str, ...],
    *,
    op: str = "CREATE",
    old: dict[str, Any] | None = None,
    kind: tuple[str, str, str] = (CR_GROUP, CR_VERSION, "NodeWright"),
) -> dict[str, Any]:
    group, version, kind_name = kind
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": kind_name},
            "operation": op,
            "name": str((obj or old or {}).get("metadata", {}).get("name", "")),
            "userInfo": {"username": user, "groups": [*groups, "system:authenticated"]},
            "object": obj,
            "oldObject": old,
        },
    }


# -- processes --------------------------------------------------------------------------------


async def _to_thread(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Blocking work (swtpm_setup, TPM commands) off the event loop. When the demo is stopped
    meanwhile, the work still finishes before the cleanup deletes the files it uses."""
    work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await work
        raise
    except (swtpm.SwtpmMissing, RuntimeError, OSError) as exc:
        raise DemoFailed(f"{what}: {exc}") from None


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def _short(text: str, limit: int = 200) -> str:
    """A refusal line for a terminal: digests shortened, at most ``limit`` characters."""
    text = re.sub(r"\b([0-9a-f]{12})[0-9a-f]{52}\b", r"\1...", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


@dataclass
class Joined:
    returncode: int
    stdout: str
    stderr: str


async def run_join(name: str, tpm: swtpm.Swtpm, server: str, bundle: Path, out: Path) -> Joined:
    """The real `nodegate join` for one node, as its boot script would run it."""
    proc = await asyncio.create_subprocess_exec(
        *_nodegate("join", "--server", server, "--ca-bundle", str(bundle), "--node-name", name),
        *("--tcti", tpm.tcti, "--out", str(out), "--attempts", "3"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(),
    )
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), JOIN_TIMEOUT)
    except TimeoutError:
        raise DemoFailed(f"nodegate join of {name} did not finish within {JOIN_TIMEOUT:.0f} s") from None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return Joined(proc.returncode or 0, stdout.decode(errors="replace"), stderr.decode(errors="replace"))


# -- the story --------------------------------------------------------------------------------


@dataclass
class Summary:
    spiffe_ids: dict[str, str]
    refused: str
    released: list[str]
    held: dict[str, str]
    allowed: int
    denied: int


class Demo:
    def __init__(self, root: Path, stack: contextlib.AsyncExitStack) -> None:
        self.root = root
        self.stack = stack
        self.tpms: dict[str, swtpm.Swtpm] = {}
        self.url = ""
        self.api_url = ""
        self.bundle = root / "bundle.pem"
        self.config = root / "nodegate.yaml"
        self.kube: Kube | None = None

    async def tpms_step(self) -> dict[int, str]:
        _step(1, "a TPM vendor CA (swtpm_localca) and 4 software TPMs (swtpm: emulated TPM hardware)")
        ca = await _to_thread("software TPMs", swtpm.make_ca, self.root / "vendor-ca")
        names = (*NODES, TAMPERED)
        made = await asyncio.gather(
            *(_to_thread(f"manufacturing {n}", swtpm.manufacture, ca, self.root / n) for n in names),
            return_exceptions=True,  # every swtpm_setup ends before a failure cleans up their files
        )
        for result in made:
            if isinstance(result, BaseException):
                raise result
        for name in names:
            # Not in a thread: the process is registered for cleanup before anything can cancel.
            try:
                tpm = swtpm.start(ca, self.root / name)
            except (RuntimeError, OSError) as exc:
                raise DemoFailed(f"starting swtpm for {name}: {exc}") from None
            self.stack.callback(tpm.stop)
            self.tpms[name] = tpm
        roots = self.root / "ek-roots.pem"
        roots.write_bytes(
            ca.root.public_bytes(serialization.Encoding.PEM)
            + ca.intermediate.public_bytes(serialization.Encoding.PEM)
        )
        golden: dict[int, str] = await _to_thread("reading PCRs", self._read_golden)
        _detail(
            f"each TPM has RSA and ECC EK certificates from that CA; the fleet's golden boot "
            f"measurements (PCR 0-7) become PCR class {PCR_CLASS}"
        )
        return golden

    def _read_golden(self) -> dict[int, str]:
        from bootstrap.node.tpm import Agent  # noqa: PLC0415  (tpm2-pytss)

        with Agent(self.tpms[NODES[0]].tcti) as agent:
            pcrs = agent.read_pcrs(SELECTION)
        return {i: v.hex() for i, v in pcrs["sha256"].items()}

    async def api_step(self) -> ShimEmulator:
        try:
            import kmock  # noqa: PLC0415

            from bootstrap.demo.emulator import ShimEmulator, cluster_signer, kubeconfig  # noqa: PLC0415
        except ImportError:
            raise DemoFailed(
                "the emulated Kubernetes API needs kmock, a test extra: run `make demo` "
                "(or pip install -e '.[test]')"
            ) from None
        _step(2, "starting the emulated Kubernetes API (kmock), in this process: not a real API server")
        emu = ShimEmulator(signer=cluster_signer())
        await self.stack.enter_async_context(emu)
        server = await self.stack.enter_async_context(kmock.Server(emu))
        register_resources(emu)
        self.api_url = str(server.url).rstrip("/")
        (self.root / "kubeconfig").write_text(yaml.safe_dump(kubeconfig(self.api_url)))
        _detail(f"{self.api_url}: Nodes, CSRs, NodeAttestations, Leases, Events, NodeWright/Skyhook CRs")
        _detail("a stand-in for kube-controller-manager signs approved kubelet CSRs (emulated cluster CA)")
        return emu

    async def serve_step(self, golden: dict[int, str]) -> None:
        _step(3, "starting `nodegate serve`: its own CA, TLS on loopback, PCR policy enforced")
        (self.root / "policies.yaml").write_text(yaml.safe_dump_all(policy_documents()))
        (self.root / "rbac.yaml").write_text(yaml.safe_dump_all(rbac_documents()))
        config = {
            "trust_domain": TRUST_DOMAIN,
            "listen": "127.0.0.1:0",
            "state_dir": "state",
            "store": "kubernetes",
            "ek_roots": ["ek-roots.pem"],
            "server_names": ["127.0.0.1", "localhost"],
            "pcr_policy": {
                "classes": [{"name": PCR_CLASS, "golden": {"sha256": {i: [v] for i, v in golden.items()}}}]
            },
            "kubernetes": {"kubeconfig": "kubeconfig"},
            # The demo runs the gate's one-shot pass itself (step 6), so serve does not run one too.
            "gate": {"enabled": False, "stability_window": "0s"},
            "admission": {"policy_files": ["policies.yaml"], "rbac_files": ["rbac.yaml"]},
        }
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        port_file, log = self.root / "serve.port", self.root / "serve.log"
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                *_nodegate("serve", "--config", str(self.config), "--port-file", str(port_file)),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=err,
                env=_env(),
            )
        self.stack.push_async_callback(_stop, proc)
        deadline = time.monotonic() + START_TIMEOUT
        while not port_file.exists():  # serve writes it (atomically) once it listens
            if proc.returncode is not None:
                raise DemoFailed(f"nodegate serve exited ({proc.returncode}): {_last_line(log)}")
            if time.monotonic() > deadline:
                raise DemoFailed(
                    f"nodegate serve did not listen within {START_TIMEOUT:.0f} s: {_last_line(log)}"
                )
            await asyncio.sleep(0.05)
        self.url = f"https://127.0.0.1:{int(port_file.read_text())}"
        # What an operator distributes to nodes: the CA certificates from state_dir.
        cas = sorted((self.root / "state" / "ca").glob("ca-*.pem"))
        self.bundle.write_bytes(b"".join(p.read_bytes() for p in cas))
        _detail(f"listening on {self.url}; store kubernetes (NodeAttestations in the emulated API)")
        _detail(f"the nodes trust only {self.bundle.name} (the CA certificates from its state_dir)")

    async def join_step(self) -> dict[str, str]:
        _step(4, f"{len(NODES)} nodes boot and run `nodegate join` (TPM attestation over TLS, concurrently)")
        _detail(
            f"$ nodegate join --server {self.url} --ca-bundle {self.bundle.name} "
            f"--node-name {NODES[0]} --tcti {self.tpms[NODES[0]].tcti}"
        )
        results = await asyncio.gather(
            *(run_join(n, self.tpms[n], self.url, self.bundle, self.root / "out" / n) for n in NODES)
        )
        ids: dict[str, str] = {}
        for name, result in zip(NODES, results, strict=True):
            if result.returncode != 0:
                raise DemoFailed(f"nodegate join of {name} failed: {result.stderr.strip()[-300:]}")
            out = self.root / "out" / name
            leaf = x509.load_pem_x509_certificate((out / "svid.pem").read_bytes())
            san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            (sid,) = san.get_values_for_type(x509.UniformResourceIdentifier)
            if sid != f"spiffe://{TRUST_DOMAIN}/node/{name}":
                raise DemoFailed(f"{name} got the SVID of {sid}")
            kubelet = yaml.safe_load((out / "kubelet.kubeconfig").read_text())
            cert = x509.load_pem_x509_certificate(
                base64.b64decode(kubelet["users"][0]["user"]["client-certificate-data"])
            )
            ids[name] = sid
            _detail(
                f"{name}: {sid}  (X.509-SVID until {leaf.not_valid_after_utc:%H:%M:%SZ}; kubelet "
                f"certificate {cert.subject.rfc4514_string()} through the CSR API)"
            )
        assert self.kube is not None  # noqa: S101  (set before this step)
        taints = [await self._hold(n) for n in NODES]
        if taints != ["packages-pending"] * len(NODES):
            raise DemoFailed(f"the Nodes were not pre-created with the hold taint: {taints}")
        _detail(f"nodegate pre-created each Node with the taint {TAINT_KEY}=packages-pending:NoSchedule")
        return ids

    async def tampered_step(self, emu: ShimEmulator, joining: asyncio.Task[Joined]) -> str:
        """``joining``: the tampered node's join, started with the others (it boots with them)."""
        _step(5, f"{TAMPERED} booted an unsigned bootloader (PCR 7 extended) and ran `nodegate join` too")
        result = await joining
        line = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
        match = re.match(r"nodegate join: refused \(([a-z0-9_]+)(?:, HTTP (\d+))?\)", line)
        if result.returncode != 1 or match is None:
            raise DemoFailed(f"the tampered node was not refused as expected: rc {result.returncode}: {line}")
        code = match.group(1)
        status = f" (HTTP {match.group(2)})" if match.group(2) else ""
        _detail(f"refused: {code}{status}; what the node prints:")
        _detail(_short(line))
        has_node = any(k[0] == "v1/nodes" and k[2] == TAMPERED for k in emu.objects)
        if has_node or (self.root / "out" / TAMPERED / "svid.pem").exists():
            raise DemoFailed(f"{TAMPERED} was refused but got an SVID or a Node")
        _detail("no SVID, no kubelet certificate, no Node object")
        return code

    def _tamper(self) -> None:
        from bootstrap.node.tpm import Agent  # noqa: PLC0415

        with Agent(self.tpms[TAMPERED].tcti) as agent:
            agent.extend_pcr(7, hashlib.sha256(b"unsigned bootloader").digest())

    async def _hold(self, name: str) -> str | None:
        assert self.kube is not None  # noqa: S101
        node = await self.kube.get_node(name)
        taints = ((node or {}).get("spec") or {}).get("taints") or []
        return next((str(t.get("value")) for t in taints if t.get("key") == TAINT_KEY), None)

    async def gate_pass(self) -> str:
        """One `nodegate gate --once` pass, with the service's config (Lease taken and given back)."""
        from bootstrap.config import load_settings  # noqa: PLC0415
        from bootstrap.gate import Gate, LeaseHeld  # noqa: PLC0415

        assert self.kube is not None  # noqa: S101
        settings = load_settings(self.config)
        gate = Gate.for_settings(self.kube, settings)
        try:
            report = await gate.once()
        except LeaseHeld as exc:
            raise DemoFailed(f"gate: {exc}") from None
        if report.errors:
            raise DemoFailed(f"gate pass: {report.errors[0]}")
        held = ", ".join(f"{r} {n}" for r, n in sorted(report.held.items())) or "none"
        return f"{report.nodes} nodes: {report.released} released; held: {held}; {report.writes} writes"

    async def _node_lines(self) -> dict[str, str | None]:
        assert self.kube is not None  # noqa: S101
        holds: dict[str, str | None] = {}
        for name in NODES:
            hold = await self._hold(name)
            holds[name] = hold
            att = await self.kube.get_cluster_object("nodegate.io", "v1alpha1", "nodeattestations", name)
            status = (att or {}).get("status") or {}
            packages = ", ".join(
                f"{p.get('package')} {p.get('state') or 'absent'}" for p in status.get("packages") or []
            )
            where = f"held: {TAINT_KEY}={hold}" if hold else "released: hold taint removed"
            _detail(f"{name}: {where}; phase {status.get('phase')}; packages: {packages}")
        return holds

    async def gate_hold_step(self) -> None:
        assert self.kube is not None  # noqa: S101
        packages = ", ".join(f"{p} {v}" for p, v in PACKAGES.items())
        _step(6, f"the hold gate: NodeWright CR {CR_NAME} ({packages}) selects the {PCR_CLASS} nodes")
        await self.kube.create_cluster_object(CR_GROUP, CR_VERSION, CR_PLURAL, package_cr())
        _detail(f"`nodegate gate --once` (stability window 0s): {await self.gate_pass()}")
        holds = await self._node_lines()
        if set(holds.values()) != {"packages-pending"}:
            raise DemoFailed(f"the gate should hold every node packages-pending: {holds}")

    async def gate_release_step(self) -> tuple[list[str], dict[str, str]]:
        assert self.kube is not None  # noqa: S101
        _step(
            7,
            f"NodeWright's agent (played by the demo) reports {' and '.join(NODES[:-1])} complete, "
            f"{NODES[-1]}'s gpu-driver erroring",
        )
        # What NodeWright's agent writes on the Node as it applies the packages (their service
        # interrupt ran, so complete means stage post-interrupt), and on gpu-node-3 a driver that
        # fails to apply.
        for name in NODES:
            failing = name == NODES[-1]
            states = {
                f"{pkg}|{version}": {
                    "name": pkg,
                    "version": version,
                    "image": f"ghcr.io/nvidia/nodewright-packages/{pkg}",
                    "stage": "apply" if failing else "post-interrupt",
                    "state": "erroring" if failing and pkg == "gpu-driver" else "complete",
                }
                for pkg, version in PACKAGES.items()
            }
            if failing:
                states.pop(f"ib-tuning|{PACKAGES['ib-tuning']}")  # waits behind the driver
            annotation = {f"{CR_GROUP}/nodeState_{CR_NAME}": json.dumps(states, sort_keys=True)}
            await self.kube.patch_node(name, {"metadata": {"annotations": annotation}})
        _detail(f"`nodegate gate --once`: {await self.gate_pass()}")
        holds = await self._node_lines()
        released = [n for n, h in holds.items() if h is None]
        held = {n: h for n, h in holds.items() if h is not None}
        if released != list(NODES[:-1]) or held != {NODES[-1]: "validation-failed"}:
            raise DemoFailed(f"the gate should release {NODES[:-1]} and hold {NODES[-1]}: {holds}")
        return released, held

    async def webhook_step(self) -> tuple[int, int]:
        assert self.kube is not None  # noqa: S101
        _step(8, f"the admission webhook judges sample CRs (POST {self.url}/admission/validate)")
        _detail(
            f"PackagePolicy {PCR_CLASS} (ghcr.io/nvidia, digests, budget <= 50%) and RBAC: ml-platform may "
            "deploy, only sre may reboot; the same decisions as `nodegate policy test`"
        )
        node = await self.kube.get_node(NODES[-1])
        if node is None:
            raise DemoFailed(f"{NODES[-1]} is gone from the emulated API")
        lifted = copy.deepcopy(node)
        lifted["spec"]["taints"] = [
            t for t in lifted["spec"].get("taints") or [] if t.get("key") != TAINT_KEY
        ]
        cases: list[tuple[str, bool, dict[str, Any]]] = [
            (
                f"alice (ml-platform) creates NodeWright {CR_NAME}",
                True,
                review(package_cr(), "alice", ("ml-platform",)),
            ),
            (f"mallory creates NodeWright {CR_NAME}", False, review(package_cr(), "mallory", ())),
            (
                "alice: an image from docker.io, interruption budget 100%",
                False,
                review(
                    package_cr(
                        interruptionBudget={"percent": 100},
                        package={"image": "docker.io/someone/gpu-driver"},
                    ),
                    "alice",
                    ("ml-platform",),
                ),
            ),
            (
                "alice: gpu-driver with a reboot interrupt",
                False,
                review(package_cr(package={"interrupt": {"type": "reboot"}}), "alice", ("ml-platform",)),
            ),
            (
                f"{NODES[-1]}'s kubelet removes its own hold taint (Node UPDATE)",
                False,
                review(
                    lifted,
                    f"system:node:{NODES[-1]}",
                    ("system:nodes",),
                    op="UPDATE",
                    old=node,
                    kind=("", "v1", "Node"),
                ),
            ),
        ]
        import aiohttp  # noqa: PLC0415

        ctx = ssl.create_default_context(cafile=str(self.bundle))
        allowed = denied = 0
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as http:
            for what, want, body in cases:
                async with http.post(f"{self.url}/admission/validate", json=body) as resp:
                    if resp.status != 200:
                        raise DemoFailed(f"webhook answered HTTP {resp.status} for {what}")
                    answer = (await resp.json())["response"]
                ok = bool(answer["allowed"])
                if ok != want:
                    raise DemoFailed(f"webhook {'allowed' if ok else 'denied'} {what}: {answer}")
                if ok:
                    allowed += 1
                    policy = (answer.get("auditAnnotations") or {}).get("policy")
                    _detail(f"ALLOWED  {what}" + (f" (PackagePolicy {policy})" if policy else ""))
                    continue
                denied += 1
                _detail(f"DENIED   {what}")
                for reason in str(answer.get("status", {}).get("message", "")).splitlines():
                    _detail(f"         {_short(reason, 240)}")
        return allowed, denied

    async def run(self) -> Summary:
        from bootstrap.kube import Kube, KubeUnavailable  # noqa: PLC0415

        golden = await self.tpms_step()
        emu = await self.api_step()
        await self.serve_step(golden)
        try:
            self.kube = await Kube.from_config(str(self.root / "kubeconfig"))
        except KubeUnavailable as exc:
            raise DemoFailed(f"the demo's kubeconfig: {exc}") from None
        if self.kube is None:
            raise DemoFailed("no kubeconfig for the emulated API")
        self.stack.push_async_callback(self.kube.close)
        # The tampered node boots with the others; its refusal is shown after their joins.
        await _to_thread("extending PCR 7", self._tamper)
        joining = asyncio.create_task(
            run_join(TAMPERED, self.tpms[TAMPERED], self.url, self.bundle, self.root / "out" / TAMPERED)
        )
        try:
            ids = await self.join_step()
            refused = await self.tampered_step(emu, joining)
            await self.gate_hold_step()
            released, held = await self.gate_release_step()
            allowed, denied = await self.webhook_step()
        except KubeUnavailable as exc:
            raise DemoFailed(f"emulated Kubernetes API: {exc}") from None
        finally:
            joining.cancel()  # run_join kills its process when cancelled
            with contextlib.suppress(asyncio.CancelledError, DemoFailed):
                await joining
        return Summary(ids, refused, released, held, allowed, denied)


async def _main(root: Path) -> Summary:
    task = asyncio.current_task()
    if task is not None:  # SIGTERM: stop as for Ctrl-C, cleaning up processes and files
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    async with contextlib.AsyncExitStack() as stack:
        try:
            async with asyncio.timeout(TOTAL_TIMEOUT):
                summary = await Demo(root, stack).run()
        except TimeoutError:
            raise DemoFailed(f"the demo took longer than {TOTAL_TIMEOUT:.0f} s") from None
        _step(9, f"cleaning up: nodegate serve, {len(NODES) + 1} swtpm processes, the emulated API, {root}")
    return summary


def run() -> int:
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="nodegate-demo-") as tmp:
            summary = asyncio.run(_main(Path(tmp)))
    except DemoFailed as exc:
        print(f"nodegate demo: failed: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("nodegate demo: interrupted; its processes and files are cleaned up", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001  (one line, never a traceback)
        print(f"nodegate demo: failed: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
        return 1
    print(
        f"demo complete in {time.monotonic() - started:.1f} s: {len(summary.spiffe_ids)} nodes attested, "
        f"1 refused ({summary.refused}), {len(summary.released)} released, {len(summary.held)} held "
        f"({', '.join(summary.held.values())}), webhook {summary.allowed} allowed / {summary.denied} denied",
        flush=True,
    )
    return 0
