"""The demo's emulated Kubernetes API: kmock with the shim (bootstrap/demo/emulator.py), in this
process on loopback, with a stand-in for the cluster's kubelet client signer. Not a real API server."""

from __future__ import annotations

import contextlib
from pathlib import Path

import kmock
import yaml

from bootstrap.demo import tables
from bootstrap.demo.emulator import ShimEmulator, cluster_signer, kubeconfig


def register_resources(emu: ShimEmulator) -> None:
    """What the demo's cluster serves (discovery); the package CRDs as NodeWright installs them."""
    for path, kind, namespaced in (
        ("v1/nodes", "Node", False),
        ("v1/events", "Event", True),
        ("coordination.k8s.io/v1/leases", "Lease", True),
        ("v1/secrets", "Secret", True),  # the disk-key secret (docs/disk-keys.md)
        ("certificates.k8s.io/v1/certificatesigningrequests", "CertificateSigningRequest", False),
        ("nodegate.io/v1alpha1/nodeattestations", "NodeAttestation", False),
        ("nodewright.nvidia.com/v1alpha1/nodewrights", "NodeWright", False),
        ("skyhook.nvidia.com/v1alpha1/skyhooks", "Skyhook", False),
    ):
        emu.resources[path] = kmock.ResourceInfo(kind=kind, namespaced=namespaced)
    emu.printer_columns["nodegate.io/v1alpha1/nodeattestations"] = list(tables.NODEATTESTATION_COLUMNS)


async def start_api(stack: contextlib.AsyncExitStack, kubeconfig_path: Path) -> tuple[ShimEmulator, str]:
    """Serve the emulated API until ``stack`` closes; write a kubeconfig for it. (emulator, URL)"""
    emu = ShimEmulator(signer=cluster_signer())
    await stack.enter_async_context(emu)
    server = await stack.enter_async_context(kmock.Server(emu))
    register_resources(emu)
    url = str(server.url).rstrip("/")
    kubeconfig_path.write_text(yaml.safe_dump(kubeconfig(url)))
    return emu, url
