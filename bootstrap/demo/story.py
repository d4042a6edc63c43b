"""The demo's steps, in order: software TPMs, the emulated API, `nodegate serve`, three joins and a
refused one, the hold gate holding and releasing, a reboot, the admission webhook's decisions,
(step 10, :mod:`bootstrap.demo.sample`) a package CR written without hold tolerations reaching a
held node, and (step 11) a what-if of a stricter measured-boot policy on the attested boots."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import itertools
import json
import re
import ssl
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bootstrap.config import load_settings
from bootstrap.demo import firmware, swtpm
from bootstrap.demo.admit import admit
from bootstrap.demo.cluster import start_api
from bootstrap.demo.disk import disk_line, empty_secret
from bootstrap.demo.emulator import ShimEmulator
from bootstrap.demo.manifests import (
    CR_GROUP,
    CR_NAME,
    CR_PLURAL,
    CR_VERSION,
    KERNEL,
    MB_CLASS,
    NODES,
    PACKAGES,
    PCR_CLASS,
    SELECTION,
    TAINT_KEY,
    TAMPERED,
    TRUST_DOMAIN,
    UNKNOWN_KERNEL,
    node_state_annotation,
    package_cr,
    policy_documents,
    rbac_documents,
    review,
    service_config,
    webhook_cases,
)
from bootstrap.demo.narration import DemoFailed, detail, short, step
from bootstrap.demo.processes import (
    Joined,
    Machine,
    run_attest,
    run_join,
    run_nodegate,
    start_serve,
    to_thread,
)
from bootstrap.demo.sample import sample_step
from bootstrap.gate import Gate, LeaseHeld
from bootstrap.kube import Kube, KubeUnavailable
from bootstrap.node.tpm import Agent

_SKYHOOK = ("skyhook.nvidia.com", "v1alpha1", "Skyhook")
# A dbx entry (an image digest) the demo's firmware lacks: the revocation a stricter policy requires.
DBX_UPDATE = "80b4d96931bf0d02fd91a61e19d14f1da452e66db2408ca8604d411f92659f0a"


@dataclass
class Summary:
    spiffe_ids: dict[str, str]
    refused: str
    released: list[str]
    held: dict[str, str]
    allowed: int
    denied: int
    rebooted: str
    tolerations: list[str]  # what the mutating webhook added to the sample CR
    sample_released: str  # the held node the sample CR reached, released once it completed


class Demo:
    def __init__(self, root: Path, stack: contextlib.AsyncExitStack) -> None:
        self.root = root
        self.stack = stack
        self.machines: dict[str, Machine] = {}
        self.db_subject = ""
        self.db_der = b""
        self.url = ""
        self.admission_url = ""  # the webhooks' own listener (admission.listen)
        self.api_url = ""
        self.bundle = root / "bundle.pem"
        self.config = root / "nodegate.yaml"
        self.kube: Kube | None = None

    async def tpms_step(self) -> dict[int, str]:
        step(1, "a TPM vendor CA (swtpm_localca) and 4 software TPMs (swtpm: emulated TPM hardware)")
        ca = await to_thread("software TPMs", swtpm.make_ca, self.root / "vendor-ca")
        names = (*NODES, TAMPERED)
        made = await asyncio.gather(
            *(to_thread(f"manufacturing {n}", swtpm.manufacture, ca, self.root / n) for n in names),
            return_exceptions=True,  # every swtpm_setup ends before a failure cleans up their files
        )
        for result in made:
            if isinstance(result, BaseException):
                raise result
        tpms: dict[str, swtpm.Swtpm] = {}
        for name in names:
            # Not in a thread: the process is registered for cleanup before anything can cancel.
            try:
                tpm = swtpm.start(ca, self.root / name)
            except (RuntimeError, OSError) as exc:
                raise DemoFailed(f"starting swtpm for {name}: {exc}") from None
            self.stack.callback(tpm.stop)
            tpms[name] = tpm
        roots = self.root / "ek-roots.pem"
        roots.write_bytes(
            ca.root.public_bytes(serialization.Encoding.PEM)
            + ca.intermediate.public_bytes(serialization.Encoding.PEM)
        )
        self.db_subject, self.db_der = firmware.db_certificate()
        booted = await asyncio.gather(
            *(to_thread(f"booting {n}", self._boot, n, tpms[n]) for n in names), return_exceptions=True
        )
        for result in booted:
            if isinstance(result, BaseException):
                raise result
            self.machines[result.name] = result
        # Read after the boot, so the golden values include its measurements.
        golden: dict[int, str] = await to_thread("reading PCRs", self._read_golden)
        events = len(firmware.linux_boot(secure_boot=True, db_cert_der=self.db_der))
        detail("each TPM has RSA and ECC EK certificates from that CA")
        detail(
            f"each machine boots (the demo plays UEFI firmware): {events} events (Secure Boot on, db CA "
            f"{self.db_subject}, shim, grub, {KERNEL}) extended into its PCRs and written to its event log"
        )
        detail(
            f"golden PCR 0-7 of that boot: PCR class {PCR_CLASS} (warn, labels the pool); "
            f"its boot chain: measured_boot class {MB_CLASS} (enforced)"
        )
        return golden

    def _boot(self, name: str, tpm: swtpm.Swtpm) -> Machine:
        """Power on: a new boot id, and the firmware measuring the boot chain into the TPM."""
        folder = self.root / "boot" / name
        folder.mkdir(parents=True, exist_ok=True)
        boot_id = folder / "boot_id"
        boot_id.write_text(f"{uuid.uuid4()}\n")
        kernel = UNKNOWN_KERNEL if name == TAMPERED else KERNEL
        events = firmware.linux_boot(secure_boot=True, db_cert_der=self.db_der, kernel=kernel)
        log = firmware.boot(tpm.tcti, events, folder / "binary_bios_measurements")
        return Machine(name, tpm, boot_id, log)

    def _read_golden(self) -> dict[int, str]:
        with Agent(self.machines[NODES[0]].tpm.tcti) as agent:
            pcrs = agent.read_pcrs(SELECTION)
        return {i: v.hex() for i, v in pcrs["sha256"].items()}

    async def _report_boot(self, name: str) -> None:
        """What the kubelet does at start: report the kernel's boot id in the Node's status."""
        boot_id = self.machines[name].boot_id_file.read_text().strip()
        await self._kube().patch_node_status(name, {"status": {"nodeInfo": {"bootID": boot_id}}})

    async def api_step(self) -> ShimEmulator:
        step(2, "starting the emulated Kubernetes API (kmock), in this process: not a real API server")
        emu, self.api_url = await start_api(self.stack, self.root / "kubeconfig")
        detail(f"{self.api_url}: Nodes, CSRs, NodeAttestations, Leases, Events, NodeWright/Skyhook CRs")
        detail("a stand-in for kube-controller-manager signs approved kubelet CSRs (emulated cluster CA)")
        return emu

    async def serve_step(self, golden: dict[int, str]) -> None:
        step(3, "starting `nodegate serve`: its own CA, TLS on loopback, measured-boot policy enforced")
        (self.root / "policies.yaml").write_text(yaml.safe_dump_all(policy_documents()))
        (self.root / "rbac.yaml").write_text(yaml.safe_dump_all(rbac_documents()))
        apps = [firmware.image_digest(a).hex() for a in ("shimx64.efi", "grubx64.efi", KERNEL)]
        # authorities by certificate digest: a subject alone admits any key under it (issue 33)
        config = service_config(golden, "sha256:" + hashlib.sha256(self.db_der).hexdigest(), apps)
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        await empty_secret(self.root / "kubeconfig")
        self.url, self.admission_url = await start_serve(self.stack, self.config, self.root)
        # What an operator distributes to nodes: the CA certificates from state_dir.
        cas = sorted((self.root / "state" / "ca").glob("ca-*.pem"))
        self.bundle.write_bytes(b"".join(p.read_bytes() for p in cas))
        detail(f"listening on {self.url}; store kubernetes (NodeAttestations in the emulated API)")
        detail(f"the nodes trust only {self.bundle.name} (the CA certificates from its state_dir)")

    async def join_step(self) -> dict[str, str]:
        step(4, f"{len(NODES)} nodes boot and run `nodegate join` (TPM attestation over TLS, concurrently)")
        detail(
            f"$ nodegate join --server {self.url} --ca-bundle {self.bundle.name} "
            f"--node-name {NODES[0]} --tcti {self.machines[NODES[0]].tpm.tcti} "
            f"--event-log boot/{NODES[0]}/binary_bios_measurements"
        )
        results = await asyncio.gather(
            *(run_join(self.machines[n], self.url, self.bundle, self.root / "out" / n) for n in NODES)
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
            detail(
                f"{name}: {sid}  (X.509-SVID until {leaf.not_valid_after_utc:%H:%M:%SZ}; kubelet "
                f"certificate {cert.subject.rfc4514_string()} through the CSR API)"
            )
        taints = [await self._hold(n) for n in NODES]
        if taints != ["packages-pending"] * len(NODES):
            raise DemoFailed(f"the Nodes were not pre-created with the hold taint: {taints}")
        detail(f"nodegate pre-created each Node with the taint {TAINT_KEY}=packages-pending:NoSchedule")
        for name in NODES:  # what each kubelet reports once it runs: the boot the gate compares
            await self._report_boot(name)
        detail("each kubelet reports its boot id (status.nodeInfo.bootID), the one the join proved")
        return ids

    async def tampered_step(self, emu: ShimEmulator, joining: asyncio.Task[Joined]) -> str:
        """``joining``: the tampered node's join, started with the others (it boots with them)."""
        step(5, f"{TAMPERED} booted an unknown kernel ({UNKNOWN_KERNEL}) and ran `nodegate join` too")
        result = await joining
        line = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
        match = re.match(r"nodegate join: refused \(([a-z0-9_]+)(?:, HTTP (\d+))?\)", line)
        if result.returncode != 1 or match is None:
            raise DemoFailed(f"the tampered node was not refused as expected: rc {result.returncode}: {line}")
        code = match.group(1)
        status = f" (HTTP {match.group(2)})" if match.group(2) else ""
        detail(f"refused: {code}{status}; what the node prints:")
        detail(short(line, 320))
        has_node = any(k[0] == "v1/nodes" and k[2] == TAMPERED for k in emu.objects)
        if has_node or (self.root / "out" / TAMPERED / "svid.pem").exists():
            raise DemoFailed(f"{TAMPERED} was refused but got an SVID or a Node")
        detail("no SVID, no kubelet certificate, no Node object")
        good, refused = self.machines[NODES[0]], self.machines[TAMPERED]
        detail(await disk_line(good, refused, self.url, self.bundle, self.root))
        return code

    def _kube(self) -> Kube:
        if self.kube is None:
            raise DemoFailed("no client for the emulated API")  # run() sets it before the steps
        return self.kube

    async def _hold(self, name: str) -> str | None:
        node = await self._kube().get_node(name)
        taints = ((node or {}).get("spec") or {}).get("taints") or []
        return next((str(t.get("value")) for t in taints if t.get("key") == TAINT_KEY), None)

    async def gate_pass(self) -> str:
        """One `nodegate gate --once` pass, with the service's config (Lease taken and given back)."""
        gate = Gate.for_settings(self._kube(), load_settings(self.config))
        try:
            report = await gate.once()
        except LeaseHeld as exc:
            raise DemoFailed(f"gate: {exc}") from None
        if report.errors:
            raise DemoFailed(f"gate pass: {report.errors[0]}")
        held = ", ".join(f"{r} {n}" for r, n in sorted(report.held.items())) or "none"
        return f"{report.nodes} nodes: {report.released} released; held: {held}; {report.writes} writes"

    async def _node_lines(self) -> dict[str, str | None]:
        holds: dict[str, str | None] = {}
        for name in NODES:
            hold = await self._hold(name)
            holds[name] = hold
            att = await self._kube().get_cluster_object("nodegate.io", "v1alpha1", "nodeattestations", name)
            status = (att or {}).get("status") or {}
            packages = ", ".join(
                f"{p.get('package')} {p.get('state') or 'absent'}" for p in status.get("packages") or []
            )
            where = f"held: {TAINT_KEY}={hold}" if hold else "released: hold taint removed"
            detail(f"{name}: {where}; phase {status.get('phase')}; packages: {packages}")
        return holds

    async def gate_hold_step(self) -> None:
        packages = ", ".join(f"{p} {v}" for p, v in PACKAGES.items())
        step(6, f"the hold gate: NodeWright CR {CR_NAME} ({packages}) selects the {PCR_CLASS} nodes")
        ctx = ssl.create_default_context(cafile=str(self.bundle))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as http:
            done = await admit(http, self.admission_url, review(package_cr(), "alice", ("ml-platform",)))
        policy = (done.answer.get("auditAnnotations") or {}).get("policy")
        detail(
            f"alice (ml-platform) applies it: /admission/mutate adds {len(done.added)} hold tolerations, "
            f"/admission/validate allows it (PackagePolicy {policy})"
        )
        await self._kube().create_cluster_object(CR_GROUP, CR_VERSION, CR_PLURAL, done.obj)
        detail(f"`nodegate gate --once` (stability window 0s): {await self.gate_pass()}")
        holds = await self._node_lines()
        if set(holds.values()) != {"packages-pending"}:
            raise DemoFailed(f"the gate should hold every node packages-pending: {holds}")

    async def gate_release_step(self) -> tuple[list[str], dict[str, str]]:
        step(
            7,
            f"NodeWright's agent (played by the demo) reports {' and '.join(NODES[:-1])} complete, "
            f"{NODES[-1]}'s gpu-driver erroring",
        )
        states: dict[str, object] = {}
        for name in NODES:
            annotations = node_state_annotation(name)
            await self._kube().patch_node(name, {"metadata": {"annotations": annotations}})
            states[name] = json.loads(next(iter(annotations.values())))
        # ... and mirrors it into the CR's status with its own credentials: what the gate decides on.
        await self._kube().patch_cluster_object(
            CR_GROUP, CR_VERSION, CR_PLURAL, CR_NAME, {"status": {"nodeState": states}}, status=True
        )
        detail(f"`nodegate gate --once`: {await self.gate_pass()}")
        holds = await self._node_lines()
        released = [n for n, h in holds.items() if h is None]
        held = {n: h for n, h in holds.items() if h is not None}
        if released != list(NODES[:-1]) or held != {NODES[-1]: "validation-failed"}:
            raise DemoFailed(f"the gate should release {NODES[:-1]} and hold {NODES[-1]}: {holds}")
        return released, held

    async def _attestation(self, name: str) -> dict[str, object]:
        att = await self._kube().get_cluster_object("nodegate.io", "v1alpha1", "nodeattestations", name)
        status: dict[str, object] = (att or {}).get("status") or {}
        return status

    async def reboot_step(self) -> str:
        """NodeWright reboots a released node; the gate holds it until `nodegate attest` proves
        the new boot. Returns the node's name."""
        name = NODES[0]
        step(
            8,
            f"NodeWright reboots {name} for a package with a reboot interrupt (played by the demo)",
        )
        before = await self._attestation(name)
        started = time.monotonic()
        old = self.machines[name]
        await to_thread(f"powering {name} off", old.tpm.power_off)
        # Power cycle: the same TPM state folder, so the same EK; Startup(CLEAR) resets the PCRs
        # and grows resetCount. Not in a thread: registered for cleanup before anything can cancel.
        try:
            tpm = swtpm.start(old.tpm.ca, old.tpm.state)
        except (RuntimeError, OSError) as exc:
            raise DemoFailed(f"restarting swtpm for {name}: {exc}") from None
        self.stack.callback(tpm.stop)
        self.machines[name] = await to_thread(f"booting {name}", self._boot, name, tpm)
        await self._report_boot(name)
        boot_id = self.machines[name].boot_id_file.read_text().strip()
        rebooted = time.monotonic()
        detail(
            f"TPM2_Shutdown, swtpm restarted on its state (a TPM reset), firmware measured the boot "
            f"again, kubelet reports boot {boot_id[:8]}...: {rebooted - started:.2f} s"
        )
        summary = await self.gate_pass()
        held = time.monotonic()
        hold = await self._hold(name)
        message = str((await self._attestation(name)).get("message", ""))
        if hold != "unattested" or "rebooted since its last attestation" not in message:
            raise DemoFailed(f"the gate should hold the rebooted {name} unattested: {hold}: {message}")
        detail(f"`nodegate gate --once`: {summary}: {held - rebooted:.2f} s")
        detail(f"{name}: held: {TAINT_KEY}={hold}; {short(message, 120)}")
        result = await run_attest(self.machines[name], self.url, self.bundle, self.root / "out" / name)
        attested = time.monotonic()
        if result.returncode != 0:
            raise DemoFailed(f"nodegate attest on {name} failed: {result.stderr.strip()[-300:]}")
        after = await self._attestation(name)
        if after.get("bootID") != boot_id:
            raise DemoFailed(f"the attestation of {name} records boot {after.get('bootID')}, not {boot_id}")
        detail(
            f"$ nodegate attest --dir out/{name} --event-log boot/{name}/binary_bios_measurements: "
            f"{result.stdout.strip().split(' as ')[0]}; resetCount {before.get('resetCount')} -> "
            f"{after.get('resetCount')}: {attested - held:.2f} s"
        )
        summary = await self.gate_pass()
        released = time.monotonic()
        if (hold := await self._hold(name)) is not None:
            raise DemoFailed(f"the gate should release {name} after its new attestation: held {hold}")
        detail(f"`nodegate gate --once`: {summary}: {released - attested:.2f} s")
        detail(f"{name}: released again, {released - started:.2f} s after its reboot began")
        return name

    async def webhook_step(self) -> tuple[int, int]:
        step(9, f"the admission webhook judges sample CRs (POST {self.admission_url}/admission/validate)")
        detail(
            f"PackagePolicy {PCR_CLASS} (ghcr.io/nvidia, digests, budget <= 50%) and RBAC: ml-platform may "
            "deploy, only sre may reboot; the same decisions as `nodegate policy test`"
        )
        node = await self._kube().get_node(NODES[-1])
        if node is None:
            raise DemoFailed(f"{NODES[-1]} is gone from the emulated API")
        ctx = ssl.create_default_context(cafile=str(self.bundle))
        allowed = denied = 0
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as http:
            for what, want, body in webhook_cases(node):
                async with http.post(f"{self.admission_url}/admission/validate", json=body) as resp:
                    if resp.status != 200:
                        raise DemoFailed(f"webhook answered HTTP {resp.status} for {what}")
                    answer = (await resp.json())["response"]
                ok = bool(answer["allowed"])
                if ok != want:
                    raise DemoFailed(f"webhook {'allowed' if ok else 'denied'} {what}: {answer}")
                if ok:
                    allowed += 1
                    policy = (answer.get("auditAnnotations") or {}).get("policy")
                    detail(f"ALLOWED  {what}" + (f" (PackagePolicy {policy})" if policy else ""))
                    continue
                denied += 1
                detail(f"DENIED   {what}")
                for reason in str(answer.get("status", {}).get("message", "")).splitlines():
                    detail(f"         {short(reason, 240)}")
        return allowed, denied

    async def sample_cr_step(self) -> tuple[list[str], str]:
        ctx = ssl.create_default_context(cafile=str(self.bundle))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as http:
            return await sample_step(self._kube(), http, self.admission_url, self.gate_pass)

    async def whatif_step(self) -> list[str]:
        """Before a stricter policy goes out: which stored boots it would refuse, and why."""
        step(11, "before a stricter policy goes out: `nodegate policy whatif` on the attested boots")
        config = yaml.safe_load(self.config.read_text())
        (cls,) = config["measured_boot"]["classes"]
        cls["dbx_required"] = [DBX_UPDATE]  # e.g. a shim the next dbx update revokes
        stricter = self.root / "stricter.yaml"
        stricter.write_text(yaml.safe_dump(config, sort_keys=False))
        detail(f"stricter.yaml: class {MB_CLASS} also requires dbx entry {DBX_UPDATE[:16]}... (a revocation)")
        detail(f"$ nodegate policy whatif --config {stricter.name} --current {self.config.name}")
        result = await run_nodegate(
            "nodegate policy whatif",
            "policy",
            "whatif",
            "--config",
            str(stricter),
            "--current",
            str(self.config),
        )
        lines = result.stdout.splitlines()
        refused = [
            ln.split(":")[0].strip()
            for ln in lines
            if ln.startswith("  ") and "measured_boot_violation" in ln
        ]
        if result.returncode != 1 or sorted(refused) != sorted(NODES):
            raise DemoFailed(
                f"whatif should refuse {', '.join(NODES)} (exit 1): exit {result.returncode}: "
                f"{short(result.stdout + result.stderr, 300)}"
            )
        shown_rule = False
        for line in itertools.takewhile(lambda ln: not ln.startswith("would change"), lines):
            if line.startswith("    "):  # the rule and the event: once, they are the same for each
                if not shown_rule:
                    detail("    " + line.strip())
                shown_rule = True
            else:
                detail(line.rstrip())
        detail(
            f"exit {result.returncode}: a CI job stops the roll-out; the fleet's dbx needs the update first"
        )
        return refused

    async def run(self) -> Summary:
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
        joining = asyncio.create_task(
            run_join(self.machines[TAMPERED], self.url, self.bundle, self.root / "out" / TAMPERED)
        )
        try:
            ids = await self.join_step()
            refused = await self.tampered_step(emu, joining)
            await self.gate_hold_step()
            released, held = await self.gate_release_step()
            rebooted = await self.reboot_step()
            allowed, denied = await self.webhook_step()
            tolerations, sample_released = await self.sample_cr_step()
            await self.whatif_step()
        except KubeUnavailable as exc:
            raise DemoFailed(f"emulated Kubernetes API: {exc}") from None
        finally:
            joining.cancel()  # run_join kills its process when cancelled
            with contextlib.suppress(asyncio.CancelledError, DemoFailed):
                await joining
        return Summary(
            ids, refused, released, held, allowed + 2, denied, rebooted, tolerations, sample_released
        )
