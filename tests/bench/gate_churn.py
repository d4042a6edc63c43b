"""The gate beside the real operator's waiting/blocked hot loop, on the real API server (issue 45):
``python -m tests.bench gate_churn [--nodes 50] [--per-second 30] [--seconds 60] [--json]``.

Cluster  tests/cluster/plane.py (etcd, kube-apiserver, kube-controller-manager, kwok) and the
         chart's CRDs and RBAC, as tests/bench/gate_cluster.py sets them up.
Nodes    N kwok nodes held ``quarantined`` (their NodeAttestations revoked), selected by two
         Skyhook CRs with a package pending on each.
Operator tests/cluster/churn.py's scripted operator: ``--per-second`` flips in all (round robin
         over nodes and CRs), each a GET, a resourceVersion-guarded Node patch of the
         ``status_<cr>`` label and annotation, a guarded Node status patch of its
         ``<cr>/NotReady`` condition, and a CR status patch of ``nodeStatus[<node>]``.
Runs     with ``nodegate serve`` (gate on) for ``--seconds``, then with nodegate stopped for as
         long. Each reports nodegate's Node and NodeAttestation writes (a watch: changes of the
         hold taint or NodegateReady, and of NodeAttestations), the 409s the operator's guarded
         patches got, the API server's request rate (its apiserver_request_total), nodegate's
         CPU time, and the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.bench.procstat import pid_cpu_seconds

CRS = ["churn-a", "churn-b"]


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _requests_total(plane: Any) -> float:
    """kube-apiserver's apiserver_request_total, summed over every label."""
    admin = (plane.folder / "pki" / "admin.crt", plane.folder / "pki" / "admin.key")
    req = urllib.request.Request(f"{plane.url}/metrics")  # noqa: S310
    with urllib.request.urlopen(req, context=plane.ssl_context(admin), timeout=30) as resp:  # noqa: S310
        text = resp.read().decode()
    return sum(
        float(m.group(1)) for m in re.finditer(r"^apiserver_request_total\{[^}]*\} (\S+)$", text, re.M)
    )


async def _setup(api: Any, names: list[str]) -> None:
    from tests.cluster import churn as ch

    now = datetime.now(UTC)
    sem = asyncio.Semaphore(16)

    async def one(method: str, path: str, body: Any, headers: dict[str, str] | None = None) -> None:
        async with sem:
            await api.ok(method, path, body, headers)

    pending = {
        "driver|1.0.0": {"name": "driver", "version": "1.0.0", "stage": "apply", "state": "in_progress"}
    }
    for cr in CRS:
        await api.ok("POST", ch.CRS, ch.churn_cr(cr))
        body = {
            "status": {"nodeState": {n: pending for n in names}, "nodeStatus": {n: "waiting" for n in names}}
        }
        await api.ok("PATCH", f"{ch.CRS}/{cr}/status", body, ch.MERGE)
    atts = [
        ch.revoked_attestation(n, 7000 + i, _stamp(now), _stamp(now + timedelta(days=1)))
        for i, n in enumerate(names)
    ]
    await asyncio.gather(*(one("POST", ch.ATTESTATIONS, body) for body, _ in atts))
    await asyncio.gather(
        *(
            one("PATCH", f"{ch.ATTESTATIONS}/{n}/status", st, ch.MERGE)
            for n, (_, st) in zip(names, atts, strict=True)
        )
    )
    await asyncio.gather(
        *(one("POST", "/api/v1/nodes", body) for body in ch.held_nodes(names, quarantined=True))
    )


def _phases(plane: Any, names: list[str]) -> dict[str, str]:
    out = json.loads(plane.kubectl("get", "nodeattestations", "-o", "json").stdout)
    return {
        i["metadata"]["name"]: (i.get("status") or {}).get("phase", "")
        for i in out["items"]
        if i["metadata"]["name"] in names
    }


def run(nodes: int, per_second: float, seconds: float) -> dict[str, Any]:
    from tests.cluster import churn as ch
    from tests.cluster import nodegate as ng
    from tests.cluster import plane as cp

    missing = cp.missing_binaries()
    if missing:
        raise SystemExit(f"gate_churn: {', '.join(missing)} missing: run `make cluster`")
    load_before = os.getloadavg()
    folder = Path(tempfile.mkdtemp(prefix="nodegate-bench-churn-"))
    plane = cp.ControlPlane.start(folder / "plane")
    server = None
    names = [f"churn-{i:04d}" for i in range(nodes)]
    admin = (plane.folder / "pki" / "admin.crt", plane.folder / "pki" / "admin.key")

    async def with_api(work: Any) -> Any:
        api = ch.Api(plane.url, plane.ssl_context(admin))
        try:
            return await work(api)
        finally:
            await api.close()

    def measure() -> dict[str, Any]:
        cpu = pid_cpu_seconds(server.proc.popen.pid) if server is not None else None
        requests = _requests_total(plane)
        t = time.monotonic()
        counts = asyncio.run(
            with_api(lambda api: ch.churn(api, names, CRS, per_second=per_second, seconds=seconds))
        )
        wall = time.monotonic() - t
        requests = _requests_total(plane) - requests
        cpu_after = pid_cpu_seconds(server.proc.popen.pid) if server is not None else None
        return {
            "flips": counts.flips,
            "operator_requests": counts.operator_requests,
            "conflicts_409": counts.conflicts,
            "conflicts_after_a_write_by": counts.conflicts_after,
            "nodegate_node_writes": counts.nodegate_node_writes,
            "nodegate_attestation_writes": counts.nodegate_attestation_writes,
            "nodes_with_attestation_writes": len(counts.attestation_writes),
            "other_taint_changes": counts.other_taint_changes,
            "seconds": round(counts.seconds, 1),
            "apiserver_requests_per_s": round(requests / wall, 1),
            "nodegate_cpu_s": round(cpu_after - cpu, 2)
            if cpu is not None and cpu_after is not None
            else None,
            "loadavg": round(os.getloadavg()[0], 2),
        }

    try:
        inst = ng.install(plane, folder / "nodegate")
        asyncio.run(with_api(lambda api: _setup(api, names)))
        plane.kubectl("wait", "--for=condition=Ready", "--timeout=300s", *[f"node/{n}" for n in names])
        server = ng.start_gate(plane, inst, "gate")
        deadline = time.monotonic() + 300
        while set(_phases(plane, names).values()) != {"Quarantined"} or len(_phases(plane, names)) < nodes:
            if time.monotonic() > deadline:
                raise SystemExit("gate_churn: the gate's first pass did not finish in 300 s")
            time.sleep(1)
        time.sleep(12)  # the lifecycle controller's taints settled and any paced write made
        with_gate = measure()
        server.stop()
        server = None
        without = measure()
        return {
            "bench": "gate_churn",
            "nodes": nodes,
            "flips_per_s": per_second,
            "with_nodegate": with_gate,
            "without_nodegate": without,
            "bound_attestation_writes": nodes * (int(seconds // 10) + 1),
            "loadavg_before": round(load_before[0], 2),
            "cpus": os.cpu_count(),
        }
    finally:
        if server is not None:
            server.stop()
        plane.stop()
        print(f"gate_churn: logs in {folder}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.bench gate_churn",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--per-second", type=float, default=30.0, help="flips per second in all")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--quick", action="store_true", help="10 nodes, 20 flips/s, 15 s")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rounds", type=int, default=1, help="accepted for the runner; unused")
    args, _ = ap.parse_known_args(list(argv) if argv is not None else None)
    nodes, rate, seconds = (10, 20.0, 15.0) if args.quick else (args.nodes, args.per_second, args.seconds)
    result = run(nodes, rate, seconds)
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"gate beside the operator's waiting/blocked loop: {nodes} held kwok nodes, {rate} flips/s, "
        f"{seconds} s per run (load {result['loadavg_before']}, {result['cpus']} CPUs)"
    )
    bound = result["bound_attestation_writes"]
    for key in ("with_nodegate", "without_nodegate"):
        r = result[key]
        print(
            f"  {key.replace('_', ' ')}: {r['flips']} flips, {r['operator_requests']} operator requests, "
            f"409s {r['conflicts_409']}; nodegate writes: Node {r['nodegate_node_writes']}, "
            f"NodeAttestation {r['nodegate_attestation_writes']} (bound {bound}); "
            f"API server {r['apiserver_requests_per_s']} requests/s; nodegate CPU {r['nodegate_cpu_s']} s; "
            f"other taint changes {r['other_taint_changes']}; load {r['loadavg']}"
        )
        print(f"    409s after a write by: {r['conflicts_after_a_write_by']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
