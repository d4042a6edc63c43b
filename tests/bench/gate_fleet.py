"""The gate benchmark's cluster (``tests.bench.gate``): N GPU nodes over pools and zones, their
attestations and the 20 package CRs with every node's report, some nodes with a package in
progress. Deterministic: the double's process and the gate's build the same one."""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from bootstrap.config import GateSettings
from bootstrap.gate import holds

PENDING_SHARE = 0.125  # 1,250 of 10,000: 210 for the reactions, 1,000 for the burst
POOLS = 8
ZONES = 3
CR_COUNT = 20
SEED = 4
# The package pods' tolerations a GPU fleet's CRs carry: the GPU taint, and the hold (docs/gate.md).
# The gate's default hold taint key, read from the settings model without building (validating) one.
KEY: str = GateSettings.model_fields["taint_key"].default
TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Exists"},
    *({"key": KEY, "operator": "Equal", "value": v, "effect": "NoSchedule"}
      for v in ("packages-pending", "validation-failed")),
]  # fmt: skip
NODEWRIGHT, SKYHOOK = "nodewright.nvidia.com", "skyhook.nvidia.com"
POOL_LABEL, ZONE_LABEL, GPU_LABEL = "nodegate.bench/pool", "nodegate.bench/zone", "nvidia.com/gpu.present"
PING = ("nodegate.bench", "v1", "pings", "ping")  # the baseline's object (Cluster.ping)


def stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _uid(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.bench.nodegate.test"))


def package_crs() -> list[dict[str, Any]]:
    """The 20 CRs: pool-specific, multi-pool, GPU-only in one zone, zone-excluding and zone-wide
    ones. Their packages are few where they select many nodes: upstream keeps every selected node's
    report in the CR's status, which must fit etcd's request limit (1.5 MiB) at 10,000 nodes too;
    a CR selecting every node of a 10,000-node fleet could not store it (build_cluster checks)."""
    out: list[dict[str, Any]] = []
    for j in range(CR_COUNT):
        group = NODEWRIGHT if j % 2 == 0 else SKYHOOK
        selector: dict[str, Any]
        packages_count = 1
        if j < 8:
            selector = {"matchLabels": {POOL_LABEL: f"pool-{j}"}}
            packages_count = 1 + j % 4
        elif j < 14:
            pools = sorted({f"pool-{(j + d) % POOLS}" for d in (0, 2, 5)})
            selector = {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": pools}]}
            packages_count = 1 + j % 2
        elif j < 16:
            selector = {
                "matchLabels": {ZONE_LABEL: f"zone-{j % ZONES}"},
                "matchExpressions": [{"key": GPU_LABEL, "operator": "Exists"}],
            }
            packages_count = 2
        elif j < 18:
            selector = {
                "matchLabels": {"kubernetes.io/os": "linux"},
                "matchExpressions": [{"key": ZONE_LABEL, "operator": "NotIn", "values": ["zone-0"]}],
            }
        else:
            selector = {
                "matchExpressions": [{"key": ZONE_LABEL, "operator": "In", "values": [f"zone-{j % ZONES}"]}]
            }
        packages: dict[str, Any] = {}
        for k in range(packages_count):
            pkg: dict[str, Any] = {"version": f"{j}.{k}.0", "image": f"ghcr.io/bench/pkg-{j:02d}-{k}"}
            if k == 0 and j % 5 == 0:
                pkg["interrupt"] = {"type": "reboot"}
            if k == 1 and j % 3 == 0:
                pkg["configInterrupts"] = {"kernel.*": {"type": "service", "services": ["kubelet"]}}
                pkg["configMap"] = {"kernel.conf": "vm.max_map_count=262144\n"}
            packages[f"pkg-{j:02d}-{k}"] = pkg
        name = f"{'nw' if group == NODEWRIGHT else 'sh'}-{j:02d}"
        spec = {
            "runtimeRequired": True,
            "nodeSelectors": selector,
            "additionalTolerations": TOLERATIONS,
            "packages": packages,
        }
        out.append(
            {
                "apiVersion": f"{group}/v1alpha1",
                "kind": holds.GROUPS[group],
                "metadata": {"name": name, "uid": _uid(name), "annotations": {}},
                "spec": spec,
                "status": {"status": "in_progress"},
            }
        )
    return out


def _node_state(cr: holds.PackageCr, stuck: str | None) -> str:
    """The nodeState annotation NodeWright writes: every package complete at the stage the
    completion rule needs, except ``stuck`` (in progress at apply)."""
    value: dict[str, Any] = {}
    for pkg in cr.packages.values():
        done_stage = "post-interrupt" if pkg.interrupt else "config"
        stage, state = ("apply", "in_progress") if pkg.name == stuck else (done_stage, "complete")
        value[f"{pkg.name}|{pkg.version}"] = {
            "name": pkg.name,
            "version": pkg.version,
            "image": f"ghcr.io/bench/{pkg.name}",
            "stage": stage,
            "state": state,
        }
    return json.dumps(value, separators=(",", ":"))


def _prefix(cr: holds.PackageCr) -> str:
    return NODEWRIGHT if cr.group == NODEWRIGHT else SKYHOOK


@dataclass(frozen=True)
class Pending:
    """A node with one package in progress, and the operator's writes that complete it."""

    node: str
    annotation: str
    complete: str  # the annotation's value with every package complete
    cr: tuple[str, str, str, str]  # group, version, plural, name: its status.nodeState[node] too


def boot_id(name: str, boot: int = 0) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"boot-{boot}.{name}.bench.nodegate.test"))


@dataclass
class Cluster:
    nodes: list[dict[str, Any]]
    attestations: list[dict[str, Any]]
    crs: list[dict[str, Any]]
    pending: list[Pending]

    def ping(self) -> dict[str, Any]:
        """The baseline's object: the first node's body under another resource."""
        node = json.loads(json.dumps(self.nodes[0]))
        node["metadata"]["name"] = PING[3]
        return {**node, "apiVersion": f"{PING[0]}/{PING[1]}", "kind": "Ping"}


def build_cluster(n: int, now: datetime, seed: int = SEED) -> Cluster:
    rng = random.Random(seed)
    crs = package_crs()
    parsed = [holds.parse_cr(cr) for cr in crs]
    statuses: dict[str, dict[str, Any]] = {}
    for cr in crs:
        cr["status"] = {"status": "in_progress", "nodeState": {}, "nodeStatus": {}}
        statuses[cr["metadata"]["name"]] = cr["status"]
    stuck = set(rng.sample(range(n), round(n * PENDING_SHARE)))
    nodes: list[dict[str, Any]] = []
    attestations: list[dict[str, Any]] = []
    pending: list[Pending] = []
    attested = now - timedelta(hours=1)
    for i in range(n):
        name = f"gpu-{i:05d}"
        pool = i % POOLS
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": f"bench.{pool}xlarge",
            POOL_LABEL: f"pool-{pool}",
            ZONE_LABEL: f"zone-{i % ZONES}",
        }
        if pool < 6:
            labels[GPU_LABEL] = "true"
        matched = [cr for cr in parsed if holds.selector_matches(cr.selector, labels)]
        hold_cr = rng.choice(matched) if i in stuck else None
        hold_pkg = rng.choice(sorted(hold_cr.packages)) if hold_cr is not None else None
        annotations = {
            "node.alpha.kubernetes.io/ttl": "0",
            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        }
        for cr in matched:
            key = f"{_prefix(cr)}/nodeState_{cr.name}"
            annotations[key] = _node_state(cr, hold_pkg if cr is hold_cr else None)
            # The operator mirrors it into the CR's status (wrapper/node.go SetStatus).
            status = statuses[cr.name]
            status["nodeState"][name] = json.loads(annotations[key])
            status["nodeStatus"][name] = "in_progress" if cr is hold_cr else "complete"
            if cr is hold_cr:
                plural = "nodewrights" if cr.group == NODEWRIGHT else "skyhooks"
                where = (cr.group, "v1alpha1", plural, cr.name)
                pending.append(Pending(name, key, _node_state(cr, None), where))
        taints: list[dict[str, Any]] = [{"key": KEY, "value": "packages-pending", "effect": "NoSchedule"}]
        if i % 4 == 0:
            taints.insert(0, {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
        beat = stamp(now - timedelta(seconds=i % 40))
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "uid": _uid(name),
                    "creationTimestamp": stamp(attested),
                    "labels": labels,
                    "annotations": annotations,
                },
                "spec": {
                    "providerID": f"bench://{name}",
                    "podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24",
                    "taints": taints,
                },
                "status": {
                    "conditions": [
                        {
                            "type": t,
                            "status": s,
                            "reason": r,
                            "message": m,
                            "lastHeartbeatTime": beat,
                            "lastTransitionTime": stamp(attested),
                        }
                        for t, s, r, m in (
                            ("MemoryPressure", "False", "KubeletHasSufficientMemory", "sufficient memory"),
                            ("DiskPressure", "False", "KubeletHasNoDiskPressure", "no disk pressure"),
                            ("PIDPressure", "False", "KubeletHasSufficientPID", "sufficient PID"),
                            ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                        )
                    ],
                    "addresses": [
                        {"type": "InternalIP", "address": f"10.200.{i // 256 % 256}.{i % 256}"},
                        {"type": "Hostname", "address": name},
                    ],
                    "capacity": {"cpu": "96", "memory": "1056457164Ki", "nvidia.com/gpu": "8", "pods": "110"},
                    "allocatable": {
                        "cpu": "95",
                        "memory": "1045971404Ki",
                        "nvidia.com/gpu": "8",
                        "pods": "110",
                    },
                    "nodeInfo": {
                        "kubeletVersion": "v1.31.4",
                        "containerRuntimeVersion": "containerd://1.7.24",
                        "kernelVersion": "6.8.0-51-generic",
                        "osImage": "Ubuntu 24.04.1 LTS",
                        "architecture": "amd64",
                        "operatingSystem": "linux",
                        "machineID": hashlib.md5(name.encode(), usedforsecurity=False).hexdigest(),
                        "bootID": boot_id(name),
                    },
                },
            }
        )
        attestations.append(
            {
                "apiVersion": "nodegate.io/v1alpha1",
                "kind": "NodeAttestation",
                "metadata": {"name": name, "uid": _uid(f"att.{name}")},
                "spec": {
                    "ekSha256": hashlib.sha256(name.encode()).hexdigest(),
                    "spiffeId": f"spiffe://bench.nodegate.test/node/{name}",
                    "revoked": False,
                },
                "status": {
                    "attestedAt": stamp(attested),
                    "expiresAt": stamp(now + timedelta(days=30)),
                    "bootID": boot_id(name),
                    "resetCount": 1,
                },
            }
        )
    return Cluster(nodes, attestations, crs, pending)
