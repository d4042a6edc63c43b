"""Issue 31's image check: in the built image, ``ek_roots: [vendors]`` (the TPM makers' roots that
`make image` took from Debian's ruby-tpm-key-attestation) trusts the real Infineon, STMicro,
Nuvoton and Intel PTT EK certificates, their intermediates fetched from a loopback HTTP server
standing in for the vendors' AIA URLs (``ek_aia.mirrors``); an intermediate that does not chain
adds no trust; an AIA URL to a private address is not fetched by default. The host-side version,
fast, is tests/service/test_ek_aia.py."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from bootstrap.service.join import vendorroots
from tests.image.runtime import Built, Podman
from tests.support.ekvendors import MAKERS_EKS, aia_server, collection_der, real_ek
from tests.support.softnode import SoftNode, b64
from tests.support.softtpm import SoftTpm

START_TIMEOUT = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_image_carries_the_package_roots_and_no_ruby(built_image: Built) -> None:
    store = built_image.rootfs / str(vendorroots.IMAGE_STORE).lstrip("/")
    for entry in vendorroots.FILES:
        assert vendorroots.check_file(store, entry)  # the bytes the table lists
    assert vendorroots.unlisted(store) == []
    assert (built_image.rootfs / "usr/share/doc" / vendorroots.PACKAGE / "copyright").is_file()
    assert not list((built_image.rootfs / "usr/bin").glob("ruby*"))
    sbom = json.loads((built_image.out / "sbom.spdx.json").read_text())
    assert any(p["name"] == vendorroots.PACKAGE for p in sbom["packages"])


@asynccontextmanager
async def serving(podman: Podman, image: str, folder: Path, config: dict[str, Any]) -> AsyncIterator[str]:
    """`nodegate serve` in the image on a loopback port (plaintext: the loopback-only dev flag)."""
    port = free_port()
    config = {"listen": f"127.0.0.1:{port}", "state_dir": "/var/lib/nodegate/state", **config}
    config["admission"] = {"listen": f"127.0.0.1:{free_port()}"}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    folder.chmod(0o755)
    (folder / "config.yaml").chmod(0o644)
    name = f"nodegate-ekroots-{port}"
    argv = podman.argv(
        *podman.run_args(name),
        *(
            "-v",
            f"{folder}:/etc/nodegate:ro",
            "--mount",
            "type=tmpfs,destination=/var/lib/nodegate,tmpfs-mode=0777",
        ),
        image,
        *("serve", "--config", "/etc/nodegate/config.yaml", "--insecure-plaintext"),
    )
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        async with aiohttp.ClientSession() as http:
            while True:
                if proc.returncode is not None or time.monotonic() > deadline:
                    _, err = await proc.communicate()
                    pytest.fail(f"serve did not come up: {err.decode()[-3000:]}")
                try:
                    async with http.get(f"{base}/healthz") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.2)
        yield base
    finally:
        if proc.returncode is None:
            podman.call("stop", "-t", "5", name, timeout=60)
            await proc.communicate()


async def start(base: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.post(f"{base}/v1/join/start", json=body) as resp:
        return resp.status, await resp.json(content_type=None)


def body_for(name: str) -> dict[str, Any]:
    ek = real_ek(name)
    body = SoftNode(SoftTpm.create(), "node-1").start_body()
    body.update(ek_public=b64(ek.ek_public), ek_certificate=b64(ek.der))
    return body


async def test_vendors_in_the_image_trusts_real_makers_eks_through_aia(
    built_image: Built, podman: Podman, tmp_path: Path
) -> None:
    async with aia_server() as aia:
        config = {
            "ek_roots": ["vendors"],
            "ek_aia": {"mirrors": aia.mirrors, "allow_private_addresses": True},
        }
        async with serving(podman, built_image.name, tmp_path / "etc", config) as base:
            for name in sorted(MAKERS_EKS):
                status, answer = await start(base, body_for(name))
                assert status == 200, (name, answer)
    assert set(aia.hits) == set(aia.served)  # every vendor's intermediate came from its AIA URL


async def test_in_the_image_a_wrong_intermediate_adds_no_trust_and_private_addresses_are_not_fetched(
    built_image: Built, podman: Podman, tmp_path: Path
) -> None:
    url = "http://pki.infineon.com/OptigaRsaMfrCA022/OptigaRsaMfrCA022.crt"
    wrong = collection_der("stmicro/STM-TPM-EK-Intermediate-CA-05-870fc181411d.pem")
    async with aia_server({url: wrong}) as aia:
        config = {
            "ek_roots": ["vendors"],
            "ek_aia": {"mirrors": aia.mirrors, "allow_private_addresses": True},
        }
        async with serving(podman, built_image.name, tmp_path / "wrong", config) as base:
            status, answer = await start(base, body_for("ek/infineon-ek-rsa-mfr-ca022.der"))
        assert (status, answer["code"]) == (403, "ek_untrusted")
        assert aia.hits == {url: 1}
    async with aia_server() as aia:
        config = {"ek_roots": ["vendors"], "ek_aia": {"mirrors": aia.mirrors}}  # private: not by default
        async with serving(podman, built_image.name, tmp_path / "default", config) as base:
            status, answer = await start(base, body_for("ek/stmicro-ek-rsa.der"))
        assert (status, answer["code"]) == (403, "ek_untrusted")
        assert "not a public address" in answer["detail"]
        assert aia.hits == {}
