"""`kubectl nodegate status` (bootstrap/kubectl.py) against kmock through tests/support/kshim.py: rows joined
from Nodes and NodeAttestations, the table and JSON, mismatches, sanitising, the command line with
a kubeconfig, and the story the gate writes (Gate.reconcile_all, then status)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from kmock._internal import enums

from bootstrap.config import GateSettings
from bootstrap.gate import Gate, kubectl
from bootstrap.gate.kubectl import NodeNotFound, NodeRow, node_row, render_json, render_table, status
from bootstrap.kube import Kube, KubeUnavailable
from tests.support.kshim import ShimEmulator
from tests.support.kshim import kubeconfig as emulated_kubeconfig

pytestmark = pytest.mark.kmock(cls=ShimEmulator)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
KEY = "nodegate.io/hold"
NODES = "v1/nodes"
ATT = "nodegate.io/v1alpha1/nodeattestations"
SKYHOOKS = "skyhook.nvidia.com/v1alpha1/skyhooks"
EK = "cd" * 32


def rfc(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def serve(kmock: Any, *, attestations: bool = True) -> None:
    kmock.resources[NODES] = {"kind": "Node", "namespaced": False}
    kmock.resources["v1/events"] = {"kind": "Event", "namespaced": True}
    kmock.resources["v1/pods"] = {"kind": "Pod", "namespaced": True}  # the gate reads package pods
    kmock.resources[SKYHOOKS] = {"kind": "Skyhook", "namespaced": False}
    if attestations:
        kmock.resources[ATT] = {"kind": "NodeAttestation", "namespaced": False}


@pytest.fixture
async def kube(kmock: Any) -> AsyncIterator[Kube]:
    serve(kmock)
    k = Kube.for_host(str(kmock.url), timeout=2.0)
    yield k
    await k.close()


def a_node(name: str, reason: str | None = None, effect: str = "NoSchedule", **labels: str) -> dict[str, Any]:
    taints = [{"key": "example.com/other", "value": "x", "effect": "NoExecute"}]
    if reason is not None:
        taints.append({"key": KEY, "value": reason, "effect": effect})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": {"taints": taints},
    }


def an_attestation(
    name: str,
    *,
    revoked: bool = False,
    attested: datetime = T0 - timedelta(hours=3),
    expires: datetime = T0 + timedelta(days=1),
    **gate_status: Any,
) -> dict[str, Any]:
    """As the join service writes it, plus whatever gate status the test gives (camelCase keys)."""
    return {
        "apiVersion": "nodegate.io/v1alpha1",
        "kind": "NodeAttestation",
        "metadata": {"name": name},
        "spec": {"ekSha256": EK, "spiffeId": f"spiffe://example.org/node/{name}", "revoked": revoked},
        "status": {"attestedAt": rfc(attested), "expiresAt": rfc(expires), **gate_status},
    }


def pkg(
    cr: str, name: str, version: str, stage: str | None, state: str | None, **extra: Any
) -> dict[str, Any]:
    return {"cr": cr, "package": name, "version": version, "stage": stage, "state": state, **extra}


async def add(kube: Kube, node: dict[str, Any], attestation: dict[str, Any] | None = None) -> None:
    await kube.create_node(node)
    if attestation is not None:
        await kube.create_cluster_object("nodegate.io", "v1alpha1", "nodeattestations", attestation)


def table(text: str) -> list[dict[str, str]]:
    """Parse render_table output by the header's column offsets."""
    lines = text.rstrip("\n").split("\n")
    header = lines[0]
    starts = [header.index(c) for c in kubectl.COLUMNS]
    ends = [*starts[1:], None]
    return [
        {c: line[s:e].strip() for c, s, e in zip(kubectl.COLUMNS, starts, ends, strict=True)}
        for line in lines[1:]
    ]


def by_node(rows: Sequence[NodeRow]) -> dict[str, NodeRow]:
    return {r.node: r for r in rows}


DRIVERS = "skyhook.nvidia.com/drivers"
HELD_MESSAGE = f"packages-pending: {DRIVERS}: gpu-driver 550.1 stage apply state in_progress"


async def three_nodes(kube: Kube) -> None:
    """held (packages pending), released, quarantined (revoked), and one that never joined."""
    await add(
        kube,
        a_node("held", "packages-pending"),
        an_attestation(
            "held",
            phase="Held",
            reason="packages-pending",
            message=HELD_MESSAGE,
            packages=[
                pkg(DRIVERS, "gpu-driver", "550.1", "apply", "in_progress"),
                pkg(DRIVERS, "tuning", "2", "config", "complete"),
            ],
            observedAt=rfc(T0),
        ),
    )
    await add(
        kube,
        a_node("ready"),
        an_attestation(
            "ready",
            phase="Ready",
            reason="",
            message="attested; 1 package(s) complete",
            packages=[pkg(DRIVERS, "gpu-driver", "550.1", "config", "complete")],
            completeSince=rfc(T0 - timedelta(minutes=10)),
        ),
    )
    await add(
        kube,
        a_node("revoked", "quarantined", "NoExecute"),
        an_attestation(
            "revoked",
            revoked=True,
            phase="Quarantined",
            reason="quarantined",
            message="quarantined: attestation revoked: the node must join again",
        ),
    )
    await add(kube, a_node("stranger", "unattested"))


# -- rows, table and JSON ----------------------------------------------------------------------


async def test_rows_for_held_released_quarantined_and_unattested(kube: Kube) -> None:
    await three_nodes(kube)
    result = await status(kube, now=T0)
    assert result.attestations_served
    assert result.note is None
    assert [r.node for r in result.rows] == ["held", "ready", "revoked", "stranger"]  # sorted by name
    rows = by_node(result.rows)

    held = rows["held"]
    assert (held.hold, held.hold_effect, held.phase, held.reason, held.mismatch) == (
        "packages-pending",
        "NoSchedule",
        "Held",
        "packages-pending",
        None,
    )
    assert held.attestation
    assert held.attestation_problem is None
    assert held.waiting == (f"{DRIVERS}: gpu-driver 550.1 (apply/in_progress)",)  # tuning is done
    assert [p.complete for p in held.packages] == [False, True]
    assert held.spiffe_id == "spiffe://example.org/node/held"
    assert held.observed_at == T0

    ready = rows["ready"]
    assert (ready.hold, ready.phase, ready.reason, ready.mismatch, ready.waiting) == (
        None,
        "Ready",
        None,
        None,
        (),
    )
    assert ready.complete_since == T0 - timedelta(minutes=10)

    revoked = rows["revoked"]
    assert (revoked.hold, revoked.hold_effect, revoked.phase, revoked.revoked) == (
        "quarantined",
        "NoExecute",
        "Quarantined",
        True,
    )
    assert revoked.waiting == ("attestation revoked: the node must join again",)

    stranger = rows["stranger"]
    assert (stranger.attestation, stranger.phase, stranger.shown_phase, stranger.mismatch) == (
        False,
        None,
        "Unattested",
        None,
    )
    assert stranger.waiting == ("no NodeAttestation: the node has not joined through nodegate",)

    cells = table(render_table(result.rows, now=T0))
    assert [c["NODE"] for c in cells] == ["held", "ready", "revoked", "stranger"]
    assert cells[0] == {
        "NODE": "held",
        "HOLD": "packages-pending",
        "PHASE": "Held",
        "REASON": "packages-pending",
        "WAITING FOR": f"{DRIVERS}: gpu-driver 550.1 (apply/in_progress)",
        "ATTESTED": "3h",
        "SPIFFE-ID": "spiffe://example.org/node/held",
    }
    assert (cells[1]["HOLD"], cells[1]["PHASE"], cells[1]["REASON"], cells[1]["WAITING FOR"]) == (
        "-",
        "Ready",
        "-",
        "-",
    )
    assert (cells[2]["HOLD"], cells[2]["PHASE"], cells[2]["WAITING FOR"]) == (
        "quarantined (NoExecute)",
        "Quarantined",
        "attestation revoked: the node must join again",
    )
    assert (cells[3]["HOLD"], cells[3]["PHASE"], cells[3]["ATTESTED"], cells[3]["SPIFFE-ID"]) == (
        "unattested",
        "Unattested",
        "-",
        "-",
    )


async def test_json_carries_everything(kube: Kube) -> None:
    await three_nodes(kube)
    doc = json.loads(render_json((await status(kube, now=T0)).rows))
    assert [d["node"] for d in doc] == ["held", "ready", "revoked", "stranger"]
    held = doc[0]
    assert held == {
        "node": "held",
        "hold": "packages-pending",
        "holdEffect": "NoSchedule",
        "attestation": True,
        "attestationValid": True,
        "attestationState": "valid",
        "bootID": None,
        "attestedBootID": None,
        "resetCount": None,
        "revoked": False,
        "phase": "Held",
        "reason": "packages-pending",
        "message": HELD_MESSAGE,
        "waitingFor": [f"{DRIVERS}: gpu-driver 550.1 (apply/in_progress)"],
        "packages": [
            pkg(DRIVERS, "gpu-driver", "550.1", "apply", "in_progress", complete=False),
            pkg(DRIVERS, "tuning", "2", "config", "complete", complete=True),
        ],
        "attestedAt": rfc(T0 - timedelta(hours=3)),
        "expiresAt": rfc(T0 + timedelta(days=1)),
        "completeSince": None,
        "observedAt": rfc(T0),
        "spiffeId": "spiffe://example.org/node/held",
        "mismatch": None,
    }
    assert (doc[1]["hold"], doc[1]["phase"], doc[1]["reason"], doc[1]["waitingFor"]) == (
        None,
        "Ready",
        None,
        [],
    )
    assert (doc[2]["revoked"], doc[2]["attestationValid"], doc[2]["holdEffect"]) == (True, False, "NoExecute")
    assert doc[2]["attestationState"] == "revoked"
    assert (doc[3]["attestation"], doc[3]["phase"], doc[3]["spiffeId"]) == (False, None, None)
    assert doc[3]["attestationState"] == "missing"


async def test_the_gates_complete_verdict_wins_over_the_state(kube: Kube) -> None:
    # An interrupting package at config/complete is not done: the gate says so when it writes "complete".
    await add(
        kube,
        a_node("w1", "packages-pending"),
        an_attestation(
            "w1",
            phase="Held",
            reason="packages-pending",
            message="packages-pending: ... (needs post-interrupt complete)",
            packages=[
                pkg(DRIVERS, "kernel", "6.8", "config", "complete", complete=False),
                pkg(DRIVERS, "tuning", "2", "apply", "in_progress", complete=True),
            ],
        ),
    )
    (row,) = (await status(kube, now=T0)).rows
    assert [p.complete for p in row.packages] == [False, True]
    assert row.waiting == (f"{DRIVERS}: kernel 6.8 (config/complete)",)


async def test_held_with_everything_complete_shows_the_gates_message(kube: Kube) -> None:
    message = "packages-pending: stable since 2026-03-01T11:59:50+00:00; released after the 0:00:30 window"
    await add(
        kube,
        a_node("w1", "packages-pending"),
        an_attestation(
            "w1",
            phase="Held",
            reason="packages-pending",
            message=message,
            packages=[pkg(DRIVERS, "gpu-driver", "550.1", "config", "complete")],
        ),
    )
    (row,) = (await status(kube, now=T0)).rows
    assert row.waiting == (message,)


# -- the taint and the status disagree -----------------------------------------------------------


async def test_mismatches_are_shown(kube: Kube) -> None:
    # tainted but Ready: the gate has not removed the taint (yet)
    await add(
        kube, a_node("lagging", "packages-pending"), an_attestation("lagging", phase="Ready", reason="")
    )
    # untainted but Held: someone removed the taint, or the gate has not written it yet
    await add(
        kube,
        a_node("untainted"),
        an_attestation(
            "untainted",
            phase="Held",
            reason="validation-failed",
            message="validation-failed: ...",
            packages=[pkg(DRIVERS, "gpu-driver", "550.1", "apply", "erroring")],
        ),
    )
    # untainted, no attestation at all: schedulable without ever joining
    await add(kube, a_node("rogue"))
    # untainted and Ready, but the attestation has expired since
    await add(
        kube,
        a_node("expired"),
        an_attestation("expired", expires=T0 - timedelta(minutes=1), phase="Ready", reason=""),
    )
    # the taint says one reason, the status another
    await add(
        kube,
        a_node("stale", "packages-pending"),
        an_attestation("stale", phase="Held", reason="validation-failed", message="validation-failed: x"),
    )
    # tainted, attested, never decided by the gate: nothing wrong, nothing known
    await add(kube, a_node("fresh", "packages-pending"), an_attestation("fresh"))
    rows = by_node((await status(kube, now=T0)).rows)

    assert rows["lagging"].mismatch == "gate lagging: status is Ready but the node is still tainted"
    assert rows["lagging"].waiting == (rows["lagging"].mismatch,)
    assert rows["untainted"].mismatch == (
        "not tainted although Held (validation-failed): gate lagging or taint removed"
    )
    assert rows["untainted"].waiting == (
        rows["untainted"].mismatch,
        f"{DRIVERS}: gpu-driver 550.1 (apply/erroring)",
    )
    assert rows["rogue"].mismatch == "not tainted without a valid attestation: schedulable"
    assert rows["rogue"].waiting == (
        "not tainted without a valid attestation: schedulable",
        "no NodeAttestation: the node has not joined through nodegate",
    )
    assert rows["expired"].mismatch == "not tainted without a valid attestation: schedulable"
    assert rows["expired"].attestation_problem == (
        f"attestation expired at {rfc(T0 - timedelta(minutes=1))}: the node must join again"
    )
    assert (
        rows["stale"].mismatch == "gate lagging: taint says packages-pending, status says validation-failed"
    )
    assert (rows["fresh"].mismatch, rows["fresh"].shown_phase, rows["fresh"].waiting) == (
        None,
        "-",
        ("not yet decided by the gate",),
    )

    cells = {c["NODE"]: c for c in table(render_table(list(rows.values()), now=T0))}
    assert cells["rogue"]["WAITING FOR"] == "not tainted without a valid attestation: schedulable (+1 more)"
    assert cells["lagging"]["WAITING FOR"] == "gate lagging: status is Ready but the node is still tainted"
    doc = {d["node"]: d for d in json.loads(render_json(list(rows.values())))}
    assert doc["untainted"]["mismatch"] == rows["untainted"].mismatch
    assert doc["expired"]["attestationValid"] is False


async def test_a_forgotten_attestation_is_not_an_attestation(kube: Kube) -> None:
    # forget() clears the spec's EK and the status times: a tombstone, not a record
    tomb = an_attestation("w1")
    tomb["spec"] = {}
    tomb["status"] = {"phase": "Held", "reason": "unattested", "message": "unattested: ..."}
    await add(kube, a_node("w1", "unattested"), tomb)
    (row,) = (await status(kube, now=T0)).rows
    assert (row.attestation, row.mismatch) == (False, None)
    assert row.waiting == ("NodeAttestation has no EK (forgotten): the node must join again",)
    assert row.attestation_state == "forgotten"


def test_rebooted_is_told_apart_from_expired_revoked_and_quarantined() -> None:
    """Which it is: the same words as the gate's (holds.attestation_problem)."""

    def row(boot: str | None, **att: Any) -> NodeRow:
        node = a_node("w1", "unattested")
        if boot is not None:
            node["status"] = {"nodeInfo": {"bootID": boot}}
        return node_row(node, an_attestation("w1", **att), now=T0)

    cases = {
        "valid": row("b1", bootID="b1"),
        "old join": row("b2"),  # no boot recorded: the boot is not compared
        "rebooted": row("b2", bootID="b1"),
        "no boot id": row(None, bootID="b1"),
        "expired": row("b2", bootID="b1", expires=T0 - timedelta(seconds=1)),
        "revoked": row("b1", bootID="b1", revoked=True),
        "stale": row("b1", bootID="b1", phase="Quarantined", reason="quarantined"),
    }
    assert {k: r.attestation_state for k, r in cases.items()} == {
        "valid": "valid",
        "old join": "valid",
        "rebooted": "rebooted",
        "no boot id": "no-boot-id",
        "expired": "expired",
        "revoked": "revoked",
        "stale": "stale",
    }
    assert cases["rebooted"].attestation_problem == "rebooted since its last attestation (boot b2)"
    assert cases["stale"].waiting[-1].startswith("attestation older than the gate's attestation_lifetime")
    assert cases["no boot id"].attestation_problem == (
        "the Node reports no boot id (status.nodeInfo.bootID) to match the attested boot b1"
    )


def test_a_recreated_or_unlabelled_node_says_so() -> None:
    """`kubectl nodegate status` reads the Node's identity as the gate does (issue 33, finding 4
    follow-up): another uid than the attestation recorded, or no attested labels."""
    attested = {
        "node-restriction.kubernetes.io/nodegate.io-attested": "true",
        "node-restriction.kubernetes.io/nodegate.io-ek-sha256": EK[:63],
    }

    def row(uid: str, labels: dict[str, str]) -> NodeRow:
        node = a_node("w1", "unattested", **labels)
        node["metadata"]["uid"] = uid
        return node_row(node, an_attestation("w1", nodeUID="u-1"), now=T0)

    assert row("u-1", attested).attestation_state == "valid"
    recreated = row("u-2", {})
    assert recreated.attestation_state == "recreated"
    assert recreated.attestation_problem is not None
    assert recreated.attestation_problem.startswith("the Node is not the object nodegate attested (uid u-2")
    assert row("u-1", {}).attestation_state == "unlabelled"


# -- one node -----------------------------------------------------------------------------------


async def test_a_named_node(kmock: Any, kube: Kube) -> None:
    await three_nodes(kube)
    lists = len(list(kmock[enums.action.LIST]))
    result = await status(kube, "revoked", now=T0)
    assert [r.node for r in result.rows] == ["revoked"]
    assert result.rows[0].phase == "Quarantined"
    assert result.attestations_served
    # nothing listed: the node and its attestation were read, and no probe was needed
    assert len(list(kmock[enums.action.LIST])) == lists
    lone = await status(kube, "stranger", now=T0)
    assert lone.attestations_served  # the probe found the resource served
    assert lone.rows[0].waiting == ("no NodeAttestation: the node has not joined through nodegate",)


async def test_a_missing_named_node(kube: Kube) -> None:
    await three_nodes(kube)
    with pytest.raises(NodeNotFound, match='node "nope" not found'):
        await status(kube, "nope")


# -- hostile or broken objects -------------------------------------------------------------------


def printable_table(text: str) -> bool:
    return all(c == "\n" or c.isprintable() for c in text)


async def test_odd_and_long_text_is_sanitised(kube: Kube) -> None:
    evil = "\x1b[2J\x1b]0;owned\x07line1\nline2\r\u202eevil\u200b" + "x" * 10_000
    await add(
        kube,
        a_node("w1", "packages-pending\x1b[31m"),
        an_attestation(
            "w1",
            phase="Held\x1b[0m",
            reason="packages-pending\x1b[31m",  # the same as the taint: no mismatch
            message=evil,
            packages=[pkg(DRIVERS, evil, "1\n2", "apply", "in_progress")],
        ),
    )
    await kube.patch_cluster_object(
        "nodegate.io",
        "v1alpha1",
        "nodeattestations",
        "w1",
        {"spec": {"spiffeId": "spiffe://example.org/\x1b[1m" + "p" * 3000}},
    )
    # junk shapes: every field of the wrong type
    await add(
        kube,
        {"metadata": {"name": "junk"}, "spec": {"taints": "nope"}},
        {
            "metadata": {"name": "junk"},
            "spec": {"ekSha256": 7, "spiffeId": ["x"], "revoked": "yes"},
            "status": {"packages": {"not": "a list"}, "attestedAt": 5, "phase": {}, "observedAt": "garbage"},
        },
    )
    rows = (await status(kube, now=T0)).rows
    text = render_table(rows, now=T0)
    lines = text.rstrip("\n").split("\n")
    assert len(lines) == 3  # a header and one line per node: no line breaks got through
    assert printable_table(text)
    for bad in ("\x1b", "\u202e", "\u200b", "\r"):
        assert bad not in text
    cells = {c["NODE"]: c for c in table(text)}
    assert cells["w1"]["HOLD"] == "packages-pending?[31m"
    assert cells["w1"]["PHASE"] == "Held?[0m"
    assert cells["w1"]["REASON"] == "packages-pending?[31m"
    waiting = cells["w1"]["WAITING FOR"]
    assert len(waiting) == kubectl.WAITING_LIMIT
    assert waiting.startswith(f"{DRIVERS}: ?[2J?]0;owned?line1?line2??evil?xxx")
    assert waiting.endswith("...")
    assert len(cells["w1"]["SPIFFE-ID"]) == 100
    assert cells["w1"]["SPIFFE-ID"].endswith("...")
    assert max(len(line) for line in lines) < 600
    junk = cells["junk"]
    assert (junk["HOLD"], junk["PHASE"], junk["ATTESTED"], junk["SPIFFE-ID"]) == ("-", "Unattested", "-", "-")

    raw = render_json(rows)
    assert printable_table(raw)  # JSON escapes control characters
    assert "\x1b" not in raw
    doc = {d["node"]: d for d in json.loads(raw)}
    assert len(doc["w1"]["message"]) == 4096  # capped, but the JSON carries the most
    assert doc["w1"]["message"].startswith("\x1b[2J")  # the text itself is kept (escaped on output)
    assert (doc["junk"]["packages"], doc["junk"]["observedAt"]) == ([], None)
    assert (doc["junk"]["revoked"], doc["junk"]["attestation"]) == (False, False)


@settings(max_examples=200, deadline=None)
@given(
    name=st.text(min_size=1, max_size=300),
    message=st.text(max_size=500),
    reason=st.text(max_size=80),
    spiffe=st.text(max_size=300),
    packages=st.lists(st.tuples(st.text(max_size=40), st.sampled_from([None, "complete", "erroring", "\n"]))),
)
def test_any_text_makes_one_printable_line_per_node(
    name: str, message: str, reason: str, spiffe: str, packages: list[tuple[str, str | None]]
) -> None:
    node = {"metadata": {"name": name}, "spec": {"taints": [{"key": KEY, "value": reason, "effect": "\x00"}]}}
    att = {
        "metadata": {"name": name},
        "spec": {"ekSha256": EK, "spiffeId": spiffe},
        "status": {
            "phase": reason,
            "reason": reason,
            "message": message,
            "packages": [pkg(DRIVERS, p, "1", "config", s) for p, s in packages],
        },
    }
    rows = [node_row(node, att, now=T0), node_row(node, None, now=T0)]
    text = render_table(rows, now=T0)
    assert text.count("\n") == 3
    assert printable_table(text)
    for line in text.split("\n"):
        assert len(line) <= sum(kubectl._CELL_LIMITS) + 3 * len(kubectl.COLUMNS)
    assert len(json.loads(render_json(rows))) == 2


def test_age_and_kubeconfig_lookup(tmp_path: Path) -> None:
    assert [kubectl.age(timedelta(seconds=s)) for s in (-5, 45, 119, 120, 7199, 7200, 172799, 172800)] == [
        "0s",
        "45s",
        "119s",
        "2m",
        "119m",
        "2h",
        "47h",
        "2d",
    ]
    there = tmp_path / "b"
    there.write_text("x")
    assert kubectl.kubeconfig_path("/flag", {"KUBECONFIG": str(there)}) == "/flag"
    assert kubectl.kubeconfig_path(None, {"KUBECONFIG": f"{tmp_path / 'a'}:{there}"}) == str(there)
    assert kubectl.kubeconfig_path(None, {"KUBECONFIG": str(tmp_path / "a")}) == str(tmp_path / "a")
    assert kubectl.kubeconfig_path(None, {"HOME": str(tmp_path)}) is None
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("x")
    assert kubectl.kubeconfig_path(None, {"HOME": str(tmp_path)}) == str(tmp_path / ".kube" / "config")


# -- the resource not served, the API failing ------------------------------------------------------


async def test_attestations_not_served_still_shows_nodes(kmock: Any) -> None:
    serve(kmock, attestations=False)
    kube = Kube.for_host(str(kmock.url), timeout=2.0)
    try:
        await kube.create_node(a_node("w1", "unattested"))
        await kube.create_node(a_node("w2"))
        result = await status(kube, now=T0)
        assert not result.attestations_served
        assert result.note == kubectl.NOT_SERVED_NOTE
        assert [(r.node, r.hold, r.shown_phase) for r in result.rows] == [
            ("w1", "unattested", "Unattested"),
            ("w2", None, "Unattested"),
        ]
        one = await status(kube, "w1", now=T0)
        assert not one.attestations_served
        assert [r.node for r in one.rows] == ["w1"]
    finally:
        await kube.close()


async def test_api_errors_raise_kube_unavailable(kmock: Any, kube: Kube) -> None:
    await three_nodes(kube)
    kmock.script("list", NODES, 500)
    with pytest.raises(KubeUnavailable, match="list nodes: HTTP 500"):
        await status(kube)
    kmock.script("list", ATT, 403)
    with pytest.raises(KubeUnavailable, match="HTTP 403"):
        await status(kube)
    kmock.script("fetch", NODES, 503)
    with pytest.raises(KubeUnavailable, match="HTTP 503"):
        await status(kube, "held")


# -- the command line ------------------------------------------------------------------------------


def kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(emulated_kubeconfig(server)))
    return path


async def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    # main() runs its own event loop (asyncio.run): a thread, while this loop serves kmock
    rc = await asyncio.to_thread(kubectl.main, argv)
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(err: str) -> str:
    assert err.endswith("\n"), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    assert err.startswith("kubectl nodegate: ")
    return err


async def test_main_with_a_kubeconfig(
    kmock: Any, kube: Kube, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await three_nodes(kube)
    cfg = str(kubeconfig(tmp_path, str(kmock.url).rstrip("/")))
    rc, out, err = await run_main(["status", "--kubeconfig", cfg], capsys)
    assert (rc, err) == (0, "")
    assert [c["NODE"] for c in table(out)] == ["held", "ready", "revoked", "stranger"]
    assert out.startswith("NODE ")

    rc, out, err = await run_main(["status", "-o", "json", "--kubeconfig", cfg], capsys)
    assert (rc, err) == (0, "")
    assert [d["node"] for d in json.loads(out)] == ["held", "ready", "revoked", "stranger"]

    rc, out, err = await run_main(["status", "ready", "-o", "json", "--kubeconfig", cfg], capsys)
    assert (rc, err) == (0, "")
    assert [(d["node"], d["phase"]) for d in json.loads(out)] == [("ready", "Ready")]

    rc, out, err = await run_main(["status", "nope", "--kubeconfig", cfg], capsys)
    assert (rc, out) == (1, "")
    assert one_line(err) == 'kubectl nodegate: node "nope" not found\n'


async def test_main_without_attestations_says_so_once(
    kmock: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serve(kmock, attestations=False)
    kmock.objects[NODES, None, "w1"] = a_node("w1", "unattested")
    cfg = str(kubeconfig(tmp_path, str(kmock.url).rstrip("/")))
    rc, out, err = await run_main(["status", "-o", "json", "--kubeconfig", cfg], capsys)
    assert rc == 0
    assert one_line(err) == f"kubectl nodegate: {kubectl.NOT_SERVED_NOTE}\n"
    assert [d["node"] for d in json.loads(out)] == ["w1"]  # stdout stays valid JSON


async def test_main_when_the_api_is_down(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = str(kubeconfig(tmp_path, f"http://127.0.0.1:{port}"))
    rc, out, err = await run_main(["status", "--kubeconfig", cfg], capsys)
    assert (rc, out) == (2, "")
    assert one_line(err).startswith("kubectl nodegate: list nodes: ")


async def test_main_when_the_api_answers_errors(
    kmock: Any, kube: Kube, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await three_nodes(kube)
    kmock.script("list", NODES, 500)
    cfg = str(kubeconfig(tmp_path, str(kmock.url).rstrip("/")))
    rc, out, err = await run_main(["status", "--kubeconfig", cfg], capsys)
    assert (rc, out) == (2, "")
    assert one_line(err).startswith("kubectl nodegate: list nodes: HTTP 500")


@pytest.mark.parametrize(
    ("argv", "rc", "says"),
    [
        (["status", "-o", "xml"], 2, "invalid choice: 'xml'"),
        (["status", "a", "b"], 2, "unrecognized arguments: b"),
        (["nope"], 2, "invalid choice: 'nope'"),
        (["status", "Bad/Name", "--kubeconfig", "/nonexistent"], 2, "'Bad/Name' is not a valid node name"),
        (["status", "--kubeconfig", "/nonexistent/kubeconfig"], 2, "kubeconfig /nonexistent/kubeconfig"),
    ],
)
def test_usage_and_kubeconfig_errors(
    argv: list[str], rc: int, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert kubectl.main(argv) == rc
    out, err = capsys.readouterr()
    assert out == ""
    assert says in one_line(err)


def test_unusable_kubeconfig_and_no_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "bad"
    bad.write_text("clusters: [\x00")
    assert kubectl.main(["status", "--kubeconfig", str(bad)]) == 2
    assert str(bad) in one_line(capsys.readouterr().err)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert kubectl.main(["status"]) == 2
    assert "no kubeconfig found" in one_line(capsys.readouterr().err)


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert kubectl.main([]) == 0
    assert "status" in capsys.readouterr().out
    assert kubectl.main(["status", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--kubeconfig" in out
    assert "-o {table,wide,json,yaml}" in out


# -- the gate's story, end to end ------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> datetime:
        return self.t


def node_state(cr: str, states: dict[str, tuple[str, str, str]]) -> dict[str, Any]:
    """The operator's nodeState for one node: package -> (version, stage, state)."""
    return {
        f"{p}|{v}": {"name": p, "version": v, "image": f"ghcr.io/x/{p}", "stage": stage, "state": state}
        for p, (v, stage, state) in states.items()
    }


async def test_status_tells_the_gates_story(kmock: Any, kube: Kube) -> None:
    clock = Clock()
    gate = Gate(
        kube,
        GateSettings(stability_window=timedelta(seconds=30)),
        events_namespace="nodegate",
        now=clock,
        identity="test",
    )
    await kube.create_cluster_object(
        "skyhook.nvidia.com",
        "v1alpha1",
        "skyhooks",
        {
            "apiVersion": "skyhook.nvidia.com/v1alpha1",
            "kind": "Skyhook",
            "metadata": {"name": "drivers"},
            "spec": {
                "runtimeRequired": True,
                "nodeSelectors": {"matchLabels": {"pool": "gpu"}},
                "additionalTolerations": [{"operator": "Exists"}],  # every taint
                "packages": {"gpu-driver": {"version": "550.1", "image": "ghcr.io/x/gpu-driver"}},
            },
        },
    )
    done = node_state("drivers", {"gpu-driver": ("550.1", "config", "complete")})
    working = node_state("drivers", {"gpu-driver": ("550.1", "apply", "in_progress")})
    failing = node_state("drivers", {"gpu-driver": ("550.1", "apply", "erroring")})
    nodes = (
        ("pending", working),
        ("done", done),
        ("failing", failing),
        ("revoked", done),
        ("rebooted", done),
    )
    for name, state in nodes:
        node = a_node(name, "packages-pending", pool="gpu")
        node["metadata"]["annotations"] = {"skyhook.nvidia.com/nodeState_drivers": json.dumps(state)}
        node["status"] = {"nodeInfo": {"bootID": f"boot-{name}-2" if name == "rebooted" else f"boot-{name}"}}
        attestation = an_attestation(name, revoked=name == "revoked", bootID=f"boot-{name}", resetCount=4)
        await add(kube, node, attestation)
    # The operator's own report, in the CR's status (what the gate decides on).
    await kube.patch_cluster_object(
        "skyhook.nvidia.com",
        "v1alpha1",
        "skyhooks",
        "drivers",
        {"status": {"nodeState": {n: state for n, state in nodes}}},
        status=True,
    )
    await add(kube, a_node("stranger", pool="gpu"))  # registered outside nodegate: no taint, no attestation

    before = by_node((await status(kube, now=T0)).rows)
    assert before["stranger"].mismatch == "not tainted without a valid attestation: schedulable"
    assert before["done"].waiting == ("not yet decided by the gate",)

    assert (await gate.reconcile_all()).errors == []
    clock.t += timedelta(seconds=30)
    report = await gate.reconcile_all()
    assert report.errors == []
    assert report.released == 1

    rows = by_node((await status(kube, now=clock.t)).rows)
    story = {n: (r.hold, r.phase, r.reason, r.mismatch, r.attestation_state) for n, r in rows.items()}
    assert story == {
        "done": (None, "Ready", None, None, "valid"),
        "failing": ("validation-failed", "Held", "validation-failed", None, "valid"),
        "pending": ("packages-pending", "Held", "packages-pending", None, "valid"),
        "rebooted": ("unattested", "Held", "unattested", None, "rebooted"),
        "revoked": ("quarantined", "Quarantined", "quarantined", None, "revoked"),
        "stranger": ("unattested", None, None, None, "missing"),  # tainted; the gate creates no attestation
    }
    assert rows["rebooted"].waiting == ("rebooted since its last attestation (boot boot-rebooted-2)",)
    reboot = json.loads(render_json([rows["rebooted"]]))[0]
    assert (reboot["bootID"], reboot["attestedBootID"], reboot["resetCount"]) == (
        "boot-rebooted-2",
        "boot-rebooted",
        4,
    )
    assert rows["pending"].waiting == (f"{DRIVERS}: gpu-driver 550.1 (apply/in_progress)",)
    assert rows["failing"].waiting == (
        f"{DRIVERS}: gpu-driver 550.1 failed: its package pod is gone (NodeWright deleted it, or it was "
        "never created)",
        f"{DRIVERS}: gpu-driver 550.1 (apply/erroring)",
    )
    assert rows["revoked"].waiting == ("attestation revoked: the node must join again",)
    assert rows["stranger"].waiting == ("no NodeAttestation: the node has not joined through nodegate",)
    assert rows["done"].waiting == ()
    assert rows["done"].complete_since == T0  # all complete at the first pass, released after the window
    assert rows["done"].observed_at == clock.t
    assert [(p.package, p.version, p.stage, p.state, p.complete) for p in rows["done"].packages] == [
        ("gpu-driver", "550.1", "config", "complete", True)
    ]

    cells = {c["NODE"]: c for c in table(render_table(list(rows.values()), now=clock.t))}
    assert {n: (c["HOLD"], c["PHASE"], c["REASON"]) for n, c in cells.items()} == {
        "done": ("-", "Ready", "-"),
        "failing": ("validation-failed", "Held", "validation-failed"),
        "pending": ("packages-pending", "Held", "packages-pending"),
        "rebooted": ("unattested", "Held", "unattested"),
        "revoked": ("quarantined", "Quarantined", "quarantined"),
        "stranger": ("unattested", "Unattested", "-"),
    }
    assert cells["rebooted"]["WAITING FOR"] == "rebooted since its last attestation (boot boot-rebooted-2)"
    assert cells["pending"]["ATTESTED"] == "3h"


async def test_a_blocked_cause_is_shown_before_the_packages_it_keeps_from_starting(kube: Kube) -> None:
    """The gate's message says why NodeWright cannot start the packages (bootstrap/gate/
    nodewright.py); the table shows that, not only "(not started)"."""
    message = (
        f"packages-pending: {DRIVERS}: NodeWright cannot schedule its package pods here (TaintNotTolerable): "
        "its package pods do not tolerate nodegate.io/hold=packages-pending:NoSchedule; fix: add to "
        "spec.additionalTolerations (operator Equal): nodegate.io/hold=packages-pending:NoSchedule, "
        "nodegate.io/hold=validation-failed:NoSchedule; nodewright.inject_tolerations adds them on a spec "
        f"change; {DRIVERS}: gpu-driver 550.1 stage - state absent"
    )
    await add(
        kube,
        a_node("w1", "packages-pending"),
        an_attestation(
            "w1",
            phase="Held",
            reason="packages-pending",
            message=message,
            packages=[pkg(DRIVERS, "gpu-driver", "550.1", None, None)],
        ),
    )
    (row,) = (await status(kube, now=T0)).rows
    assert row.waiting == (
        f"blocked (TaintNotTolerable): {DRIVERS}: does not tolerate "
        "nodegate.io/hold=packages-pending:NoSchedule",
        f"{DRIVERS}: gpu-driver 550.1 (not started)",
    )
    table = render_table([row], now=T0)
    assert "blocked (TaintNotTolerable): " in table
    assert "(+1 more)" in table
    assert render_json([row]).count("blocked (TaintNotTolerable)") == 1
