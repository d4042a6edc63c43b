"""``kubectl nodegate status`` with kubectl's flags: ``--context``, ``-l/--selector``,
``--reason``, ``-o wide|yaml`` (wide truncates nothing and shows the gate's message)."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from bootstrap.gate import kubectlopts
from bootstrap.gate.holds import Reason
from bootstrap.gate.kubectl import node_row, render_table, status
from bootstrap.kube import Kube
from tests.gate.test_kubectl import (
    HELD_MESSAGE,
    a_node,
    add,
    an_attestation,
    kubeconfig,
    run_main,
    serve,
    three_nodes,
)
from tests.support.kshim import ShimEmulator

pytestmark = pytest.mark.kmock(cls=ShimEmulator)


@pytest.fixture
async def kube(kmock: Any) -> AsyncIterator[Kube]:
    serve(kmock)
    k = Kube.for_host(str(kmock.url), timeout=2.0)
    yield k
    await k.close()


def _names(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines()[1:]]


async def test_reason_filter_and_wide(
    kmock: Any,
    kube: Kube,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await three_nodes(kube)
    cfg = str(kubeconfig(tmp_path, str(kmock.url).rstrip("/")))
    rc, out, err = await run_main(["status", "--kubeconfig", cfg, "--reason", "packages-pending"], capsys)
    assert (rc, err) == (0, "")
    assert _names(out) == ["held"]
    rc, out, _ = await run_main(["status", "--kubeconfig", cfg, "--reason", "none"], capsys)
    assert _names(out) == ["ready"]
    rc, out, _ = await run_main(["status", "--kubeconfig", cfg, "-o", "wide"], capsys)
    header = out.splitlines()[0].split("   ")
    assert [h.strip() for h in header if h.strip()] == list(kubectlopts.WIDE_COLUMNS)
    held = next(line for line in out.splitlines() if line.startswith("held "))
    assert HELD_MESSAGE in held  # the gate's whole message, not cut
    rc, out, _ = await run_main(["status", "--kubeconfig", cfg, "-o", "yaml"], capsys)
    docs = yaml.safe_load(out)
    assert [d["node"] for d in docs] == ["held", "ready", "revoked", "stranger"]
    assert docs[0]["reason"] == "packages-pending"


async def test_selector_and_context(
    kmock: Any,
    kube: Kube,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await add(kube, a_node("gpu-1", "unattested", pool="gpu"), an_attestation("gpu-1"))
    await add(kube, a_node("cpu-1", "unattested", pool="cpu"), an_attestation("cpu-1"))
    path = kubeconfig(tmp_path, str(kmock.url).rstrip("/"))
    doc = yaml.safe_load(path.read_text())
    doc["contexts"].append({"name": "broken", "context": {"cluster": "nowhere", "user": "nodegate"}})
    doc["current-context"] = "broken"
    path.write_text(yaml.safe_dump(doc))
    cfg = str(path)
    rc, _, err = await run_main(["status", "--kubeconfig", cfg], capsys)
    assert rc == 2  # the current context points nowhere
    rc, out, err = await run_main(
        ["status", "--kubeconfig", cfg, "--context", "emulated", "-l", "pool=gpu"], capsys
    )
    assert (rc, err) == (0, "")
    assert _names(out) == ["gpu-1"]


def test_reason_choices_are_the_hold_reasons() -> None:
    assert set(kubectlopts.REASONS) == {*get_args(Reason), "none"}


async def test_watch_prints_a_row_per_change(kmock: Any, kube: Kube) -> None:
    await three_nodes(kube)
    result = await status(kube)
    changed = a_node("held", None)  # the gate lifted the hold
    changed["metadata"]["resourceVersion"] = "2000"
    held = a_node("stranger", "unattested")
    held["metadata"]["resourceVersion"] = "2001"
    kmock.script(
        "watch", "v1/nodes", [{"type": "MODIFIED", "object": changed}, {"type": "MODIFIED", "object": held}]
    )
    out: list[str] = []
    args = argparse.Namespace(selector=None, node=None, reason=None, output="table")
    await kubectlopts.follow(
        kube, result.resource_version, args, node_row, render_table, out.append, streams=1
    )
    assert [line.split()[0] for line in "".join(out).splitlines()] == ["held", "stranger"]
    assert not any(line.startswith("NODE") for line in out)  # rows only, as kubectl get -w
    out.clear()
    kmock.script(
        "watch", "v1/nodes", [{"type": "MODIFIED", "object": changed}, {"type": "MODIFIED", "object": held}]
    )
    args.reason = "unattested"
    await kubectlopts.follow(kube, "", args, node_row, render_table, out.append, streams=1)
    assert [line.split()[0] for line in "".join(out).splitlines()] == ["stranger"]
