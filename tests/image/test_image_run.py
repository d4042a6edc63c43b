"""The built image started as the chart's pod would start it (podman, see runtime.py and pod.py):
the ca-init container fills the CA Secret in an emulated Kubernetes API (kmock behind real TLS,
reached with the in-cluster service account), `nodegate serve` comes up with the chart's rendered
config and Helm-generated serving certificate, /readyz answers over TLS, and a machine with a
swtpm TPM joins from the host with the real `nodegate join`."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import shutil
import socket
import ssl
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest
import yaml
from aiohttp import test_utils
from cryptography.hazmat.primitives import serialization

from bootstrap.demo.cluster import register_resources
from bootstrap.demo.emulator import ShimEmulator, cluster_signer
from tests.image.pod import Pod, find, render
from tests.image.runtime import ROOT, Built, Podman
from tests.support.certs import loopback_tls
from tests.support.swtpms import TpmInfo

pytestmark = pytest.mark.swtpm

NAMESPACE = "nodegate"
START_TIMEOUT = 90.0
FS_GROUP = 65532


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tls_server(ctx: ssl.SSLContext) -> type[test_utils.RawTestServer]:
    class TlsServer(test_utils.RawTestServer):
        async def start_server(self, **kwargs: Any) -> None:
            await super().start_server(ssl=ctx, **kwargs)

    return TlsServer


@contextlib.asynccontextmanager
async def kube_api(folder: Path) -> AsyncIterator[tuple[ShimEmulator, int, Path]]:
    """The emulated API over TLS on loopback: (emulator, port, its CA certificate)."""
    cert, key, _ = loopback_tls(folder, "kubernetes (emulated)")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    emu = ShimEmulator(signer=cluster_signer())
    async with emu, kmock.Server(emu, server_cls=tls_server(ctx)) as server:
        register_resources(emu)
        emu.resources["v1/secrets"] = kmock.ResourceInfo(kind="Secret", namespaced=True)
        for crd_file in sorted((ROOT / "charts" / "nodegate" / "crds").glob("*.yaml")):
            crd = yaml.safe_load(crd_file.read_text())["spec"]
            for version in crd["versions"]:
                path = f"{crd['group']}/{version['name']}/{crd['names']['plural']}"
                namespaced = crd["scope"] == "Namespaced"
                emu.resources[path] = kmock.ResourceInfo(kind=crd["names"]["kind"], namespaced=namespaced)
        yield emu, int(server.url.port or 0), cert


def chart_with_listeners(port: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Render with this test's port and the EK roots ConfigMap; the config is read back from the
    render, and any further listener it names is moved to a free port (host network)."""
    docs = render(
        NAMESPACE,
        f"containerPort={port}",
        "replicaCount=1",
        "tls.ipAddresses={127.0.0.1}",
        "ekRoots.configMap=ek-roots",
    )
    config = yaml.safe_load(find(docs, "ConfigMap")["data"]["config.yaml"])
    assert config["listen"] == f"0.0.0.0:{port}"
    return docs, config


def move_other_listeners(docs: list[dict[str, Any]], config: dict[str, Any]) -> None:
    moved = False
    for section in config.values():
        if isinstance(section, dict) and isinstance(section.get("listen"), str):
            host = section["listen"].rsplit(":", 1)[0]
            section["listen"] = f"{host}:{free_port()}"
            moved = True
    if moved:
        find(docs, "ConfigMap")["data"]["config.yaml"] = yaml.safe_dump(config)


async def podman_run(
    podman: Podman, name: str, image: str, pod: Pod, container: str
) -> asyncio.subprocess.Process:
    before, after = pod.command(container)
    argv = podman.argv(*podman.run_args(name), *pod.podman_args(container), *before, image, *after)
    return await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


async def play_kubelet(
    emu: ShimEmulator, secret: str, folder: Path, gid: int, proc: asyncio.subprocess.Process
) -> None:
    """What the kubelet does for the mounted CA Secret: show its data once ca-init has written it."""
    key: Any = ("v1/secrets", NAMESPACE, secret)
    deadline = time.monotonic() + START_TIMEOUT
    while proc.returncode is None and time.monotonic() < deadline:
        data = emu.objects[key].raw.get("data") or {}
        if "index.json" in data and "session.key" in data:
            for name, value in data.items():
                path = folder / name
                path.write_bytes(base64.b64decode(value))
                path.chmod(0o440)  # the volume's defaultMode, group fsGroup
                shutil.chown(path, 0, gid)
            return
        await asyncio.sleep(0.1)


async def wait_ready(url: str, ctx: ssl.SSLContext, proc: asyncio.subprocess.Process) -> int:
    deadline = time.monotonic() + START_TIMEOUT
    status = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as http:
        while time.monotonic() < deadline and proc.returncode is None:
            try:
                async with http.get(url) as resp:
                    status = resp.status
                    if status == 200:
                        return status
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.2)
    return status


async def test_the_image_runs_as_the_charts_pod_and_a_swtpm_machine_joins(
    built_image: Built, podman: Podman, swtpm: TpmInfo, tmp_path: Path
) -> None:
    port = free_port()
    docs, config = chart_with_listeners(port)
    move_other_listeners(docs, config)
    ek_roots = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (swtpm.root, swtpm.intermediate))
    async with kube_api(tmp_path) as (emu, api_port, api_ca):
        pod = Pod(docs, tmp_path, NAMESPACE, ("127.0.0.1", api_port), {"ek-roots": {"roots.pem": ek_roots}})
        sa = pod.service_account()
        (sa / "token").write_text("emulated-service-account-token")  # projected tokens end without a newline
        (sa / "ca.crt").write_bytes(api_ca.read_bytes())
        (sa / "namespace").write_text(NAMESPACE)
        ca_secret = find(docs, "Secret", "-ca")
        ca_secret["metadata"]["resourceVersion"] = "1"  # as the API server would have stored it
        emu.objects["v1/secrets", NAMESPACE, ca_secret["metadata"]["name"]] = ca_secret
        volumes = {v["name"]: v for v in pod.deployment["spec"]["template"]["spec"]["volumes"]}
        ca_dir = pod.volume_dir(volumes["ca"])

        # 1. the init container, as the chart runs it (python3 from the image, the chart's script).
        init = await podman_run(podman, "nodegate-ca-init", built_image.name, pod, "ca-init")
        kubelet = asyncio.ensure_future(
            play_kubelet(emu, ca_secret["metadata"]["name"], ca_dir, FS_GROUP, init)
        )
        out, err = await asyncio.wait_for(init.communicate(), START_TIMEOUT)
        await kubelet
        assert init.returncode == 0, err.decode()[-2000:]
        assert b"wrote a new CA and a session key" in out, out
        assert b"CA ok: trust domain fleet.test" in out, out  # pod.render sets it

        # 2. the server: the chart's command, config, TLS Secret, volumes.
        serve = await podman_run(podman, "nodegate-serve", built_image.name, pod, "nodegate")
        try:
            tls = find(docs, "Secret", "-tls")["data"]
            helm_ca = tmp_path / "helm-ca.crt"
            helm_ca.write_bytes(base64.b64decode(tls["ca.crt"]))
            ctx = ssl.create_default_context(cafile=str(helm_ca))
            status = await wait_ready(f"https://127.0.0.1:{port}/readyz", ctx, serve)
            if status != 200:
                serve.terminate()
                _, err = await serve.communicate()
                pytest.fail(f"/readyz answered {status}; serve: {err.decode()[-3000:]}")

            # 3. a machine joins from the host, trusting the Helm CA as an operator would hand it out.
            out_dir = tmp_path / "node"
            join = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bootstrap.cli", "join",
                "--server", f"https://127.0.0.1:{port}", "--ca-bundle", str(helm_ca),
                "--node-name", "gpu-node-1", "--tcti", swtpm.tcti, "--attempts", "2", "--out", str(out_dir),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            _, jerr = await asyncio.wait_for(join.communicate(), START_TIMEOUT)
            assert join.returncode == 0, jerr.decode()[-2000:]
            assert (out_dir / "svid.pem").is_file()
            # ... and the server in the container pre-created its Node, held, in the cluster.
            node = emu.objects["v1/nodes", None, "gpu-node-1"].raw
            taints = {t["key"] for t in node["spec"].get("taints", [])}
            assert config["gate"]["taint_key"] in taints
        finally:
            if serve.returncode is None:
                podman.call("stop", "-t", "5", "nodegate-serve", timeout=60)
                await serve.communicate()
