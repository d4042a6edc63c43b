"""``nodegate nodes list|show|revoke|unrevoke|forget`` against a real ``serve`` (the CLI's start
path, TLS, admin SVID over mTLS) on both stores; ``forget`` replaces the hand-written SQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bootstrap.cli.main import main as cli_main
from bootstrap.config import load_settings
from bootstrap.service.serve import Serving, start
from tests.service.test_abuse import base, http
from tests.support.kshim import ShimEmulator, cluster_signer
from tests.support.service import EkCa
from tests.support.softnode import join

pytestmark = pytest.mark.kmock(cls=ShimEmulator)
ADMIN = "spiffe://fleet.test/admin/ops"
READER = "spiffe://fleet.test/admin/viewer"


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


@pytest.fixture(params=["sqlite", "kubernetes"])
async def served(
    request: pytest.FixtureRequest, kmock: Any, tmp_path: Path, ek_ca: EkCa
) -> AsyncIterator[tuple[Serving, list[str], Path]]:
    doc: dict[str, Any] = {
        "trust_domain": "fleet.test",
        "listen": "127.0.0.1:0",
        "state_dir": str(tmp_path / "state"),
        "ek_roots": [str(ek_ca.write(tmp_path / "ek-root.pem"))],
        "store": request.param,
        "admin": {"spiffe_ids": {ADMIN: ["list", "revoke", "forget"], READER: ["list"]}},
        "admission": {"policy_files": []},
    }
    if request.param == "kubernetes":
        kmock.resources["nodegate.io/v1alpha1/nodeattestations"] = {
            "kind": "NodeAttestation",
            "namespaced": False,
        }
        kmock.signer = cluster_signer()
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "k", "cluster": {"server": str(kmock.url).rstrip("/")}}],
                    "users": [{"name": "u", "user": {}}],
                    "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                    "current-context": "c",
                }
            )
        )
        doc["kubernetes"] = {"kubeconfig": str(kubeconfig)}
        doc["gate"] = {"enabled": False}
    config = tmp_path / "nodegate.yaml"
    config.write_text(yaml.safe_dump(doc))
    serving = await start(load_settings(config))
    try:
        bundle = tmp_path / "bundle.pem"
        async with http(serving) as h, h.get(f"{base(serving)}/v1/bundle?format=pem") as resp:
            bundle.write_bytes(await resp.read())
        admin = tmp_path / "admin"
        issue = ["ca", "issue-admin", "--config", str(config), "--spiffe-id", ADMIN, "--out", str(admin)]
        assert await asyncio.to_thread(cli_main, issue) == 0
        flags = ["--server", base(serving), "--ca-bundle", str(bundle), "--admin", str(admin)]
        yield serving, flags, config
    finally:
        await serving.close()


async def nodes(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(cli_main, ["nodes", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


async def test_list_show_revoke_unrevoke_forget(
    served: tuple[Serving, list[str], Path], ek_ca: EkCa, capsys: pytest.CaptureFixture[str]
) -> None:
    serving, flags, _ = served
    async with http(serving) as h:
        for name in ("gpu-1", "gpu-2"):
            status, out = await join(h, base(serving), ek_ca.node(name))
            assert status == 200, out

    code, out, err = await nodes(capsys, "list", *flags)
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split()[:4] == ["NAME", "REVOKED", "ATTESTED", "EXPIRES"]
    assert [r.split()[0] for r in rows] == ["gpu-1", "gpu-2"]
    assert all(r.split()[1] == "no" for r in rows)

    code, out, _ = await nodes(capsys, "list", *flags, "-o", "json")
    listing = json.loads(out)
    assert [n["node_name"] for n in listing["nodes"]] == ["gpu-1", "gpu-2"]
    assert listing["damaged"] == []
    code, out, _ = await nodes(capsys, "list", *flags, "-o", "yaml")
    assert yaml.safe_load(out) == listing

    code, out, _ = await nodes(capsys, "revoke", "gpu-1", "--reason", "RMA 42", *flags)
    assert (code, out.strip()) == (0, "gpu-1: revoked")
    code, out, _ = await nodes(capsys, "show", "gpu-1", *flags, "-o", "json")
    shown = json.loads(out)
    assert shown["revoked"] is True
    assert shown["ek_sha256"] == listing["nodes"][0]["ek_sha256"]
    assert any(
        a["action"] == "revoke" and a["actor"] == ADMIN and "RMA 42" in a["detail"] for a in shown["audit"]
    )
    code, out, _ = await nodes(capsys, "show", "gpu-1", *flags)
    assert "revoked:" in out
    assert "yes" in out

    code, out, _ = await nodes(capsys, "unrevoke", "gpu-1", "--reason", "back", *flags)
    assert (code, out.strip()) == (0, "gpu-1: not revoked")

    # forget: the re-imaged machine (a new TPM, so a new EK) may take the name again
    async with http(serving) as h:
        status, out_doc = await join(h, base(serving), ek_ca.node("gpu-2"))
    assert status == 409
    assert out_doc["code"] == "node_name_conflict"
    code, out, _ = await nodes(capsys, "forget", "gpu-2", "--reason", "re-imaged", *flags)
    assert (code, out.strip()) == (0, "gpu-2: forgotten (the name may join with a new EK)")
    async with http(serving) as h:
        status, out_doc = await join(h, base(serving), ek_ca.node("gpu-2"))
    assert status == 200, out_doc


async def test_refusals_are_one_line_with_the_code(
    served: tuple[Serving, list[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, flags, config = served
    code, _, err = await nodes(capsys, "show", "nope", *flags)
    assert code == 1
    assert err.strip() == "nodegate nodes show: not_found (HTTP 404): no node nope"
    code, _, err = await nodes(capsys, "forget", "nope", "--reason", "x", *flags)
    assert code == 1
    assert "not_found" in err
    # a reader may list but not forget
    reader = tmp_path / "reader"
    issue = ["ca", "issue-admin", "--config", str(config), "--spiffe-id", READER, "--out", str(reader)]
    assert await asyncio.to_thread(cli_main, issue) == 0
    mine = [*flags[:-1], str(reader)]
    assert (await nodes(capsys, "list", *mine))[0] == 0
    code, _, err = await nodes(capsys, "forget", "gpu-1", "--reason", "x", *mine)
    assert code == 1
    assert f"{READER} may not forget" in err
    assert len(err.strip().splitlines()) == 1


async def test_usage_mistakes_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = await nodes(
        capsys, "list", "--server", "https://127.0.0.1:1", "--ca-bundle", str(tmp_path / "x")
    )
    assert code == 2
    assert "--admin is required" in err
    code, _, err = await nodes(
        capsys, "list", "--server", "http://10.0.0.1:1", "--ca-bundle", "x", "--admin", "y"
    )
    assert code == 2
    assert "--server must be https://host[:port], not 'http://10.0.0.1:1'" in err
    missing = tmp_path / "nowhere.pem"
    code, _, err = await nodes(
        capsys,
        "list",
        "--server",
        "https://127.0.0.1:1",
        "--ca-bundle",
        str(missing),
        "--admin",
        str(tmp_path),
    )
    assert code == 2
    assert f"CA bundle {missing} does not exist" in err


async def test_list_and_quarantine_by_selector(
    served: tuple[Serving, list[str], Path], ek_ca: EkCa, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--where`` selects on the boot records (issue 43); ``quarantine --dry-run`` lists and
    writes nothing; ``quarantine`` holds exactly the matching nodes, each audited with the reason
    and the selector."""
    serving, flags, _ = served
    async with http(serving) as h:
        for name in ("gpu-1", "gpu-2", "cpu-1"):
            status, out = await join(h, base(serving), ek_ca.node(name))
            assert status == 200, out
    code, out, err = await nodes(
        capsys, "list", *flags, "--where", "node=gpu-*", "--where", "tpm-model=swtpm", "-o", "json"
    )
    assert code == 0, err
    assert [n["node_name"] for n in json.loads(out)["nodes"]] == ["gpu-1", "gpu-2"]
    code, out, _ = await nodes(capsys, "list", *flags, "--where", "tpm-model=ST33*")
    assert (code, out.strip()) == (0, "no nodes")

    store = serving.service.store
    before = [await store.get(n) for n in ("gpu-1", "gpu-2", "cpu-1")]
    code, out, _ = await nodes(
        capsys, "quarantine", *flags, "--where", "node=gpu-*", "--reason", "shim CVE", "--dry-run"
    )
    assert code == 0
    assert out.splitlines() == [
        "would quarantine 2 node(s) (--dry-run: nothing written):",
        "  gpu-1",
        "  gpu-2",
    ]
    assert [await store.get(n) for n in ("gpu-1", "gpu-2", "cpu-1")] == before
    assert not [a for a in await store.audit() if a.action == "quarantine"]

    code, out, err = await nodes(
        capsys, "quarantine", *flags, "--where", "node=gpu-*", "--reason", "shim CVE"
    )
    assert code == 0, err
    assert out.splitlines() == ["quarantined 2 node(s):", "  gpu-1", "  gpu-2"]
    for name in ("gpu-1", "gpu-2"):
        rec = await store.get(name)
        assert rec is not None
        assert rec.quarantine is not None
        assert (rec.quarantine.reason, rec.quarantine.actor) == ("shim CVE (--where node=gpu-*)", ADMIN)
    assert (await store.get("cpu-1")).quarantine is None  # type: ignore[union-attr]
    code, out, _ = await nodes(capsys, "show", "gpu-1", *flags, "-o", "json")
    shown = json.loads(out)
    assert shown["quarantine"]["reason"] == "shim CVE (--where node=gpu-*)"
    assert any(a["action"] == "quarantine" and a["actor"] == ADMIN for a in shown["audit"])
    code, _, err = await nodes(capsys, "quarantine", *flags, "--reason", "everything")
    assert code == 2
    assert "--where FIELD=VALUE is required" in err
