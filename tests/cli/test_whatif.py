"""``nodegate policy whatif`` (issue 43): a stricter measured_boot or PCR policy judged against every
stored boot record before it is rolled out, from the sqlite store (read only), from a
``kubectl nodegate boots -o json`` export, or for PackagePolicies against package CRs; who would
be refused with the rule and the event, who changes class, who newly passes, and exit codes a CI
job can branch on."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from attest import eventlog
from attest.bootrecord.build import record_facts
from attest.bootrecord.model import BootRecord
from attest.measuredboot import policy as measuredboot
from bootstrap.cli.main import main
from bootstrap.gate import kubectlboots
from bootstrap.store.sqlite import SqliteStore
from tests.admission.test_webhook import gpu_policies
from tests.store.common import T0, commit, make_att
from tests.support import bootrecords
from tests.support import eventlogs as el
from tests.support.package_crs import SAMPLE, open_policy
from tests.support.shared_data import shared

DATA = shared("eventlogs")
UBUNTU, GDC, ARCH = "gce-ubuntu-2404-amd-sev-snp.bin", "gdc-host.bin", "arch-linux-workstation.bin"
PCRS = list(range(10))


def _built(name: str, boot: int) -> bootrecords.Built:
    raw = DATA.read(name)
    return bootrecords.built_from(
        raw, bootrecords.quoted_of(raw, "sha256", PCRS), boot_id=f"{boot:08x}-0000-4000-8000-000000000000"
    )


def _learned(name: str, **changes: Any) -> dict[str, Any]:
    raw = DATA.read(name)
    facts = record_facts(eventlog.parse(raw), bootrecords.quoted_of(raw, "sha256", PCRS))
    assert facts is not None
    learned = measuredboot.learn([facts], name="-".join(name.split("-")[:2]))
    return {**learned.model_dump(exclude_none=True), **changes}


def _config(tmp: Path, name: str, measured_boot: dict[str, Any], pcrs: list[int] = PCRS) -> Path:
    path = tmp / name
    doc = {"state_dir": str(tmp / "state"), "pcr_policy": {"pcrs": pcrs}, "measured_boot": measured_boot}
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
async def state(tmp_path: Path) -> dict[str, BootRecord]:
    """A sqlite store holding gpu-0, gpu-1 (Ubuntu), cpu-0 (the GDC host) and arch-0, as the join
    service wrote them."""
    DATA.require()
    store = await SqliteStore.open(tmp_path / "state" / "nodegate.db")
    out = {}
    try:
        plan = [("gpu-0", UBUNTU), ("gpu-1", UBUNTU), ("cpu-0", GDC), ("arch-0", ARCH)]
        for i, (node, log) in enumerate(plan):
            built = _built(log, i)
            att = replace(
                make_att(node, f"{i + 1:x}" * 64, at=T0 + timedelta(minutes=i)),
                boot_id=built.record.boot_id,
                boot_record=built.record,
                dbx=tuple(built.dbx.items()),
            )
            await commit(store, att, f"s-{node}")
            out[node] = built.record
        await commit(store, make_att("legacy", "f" * 64), "s-legacy")  # from before boot records
    finally:
        await store.close()
    return out


def _run_sync(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["policy", "whatif", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


async def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    # main() runs its own event loop (asyncio.run): on a thread, beside this test's loop
    return await asyncio.to_thread(_run_sync, argv, capsys)


async def test_a_stricter_measured_boot_names_who_would_be_refused_and_why(
    tmp_path: Path, state: dict[str, BootRecord], capsys: pytest.CaptureFixture[str]
) -> None:
    current = _config(
        tmp_path, "current.yaml", {"classes": [_learned(UBUNTU), _learned(GDC), _learned(ARCH)]}
    )
    ubuntu = _learned(UBUNTU)
    shim = ubuntu["boot_applications"][0]
    stricter = {
        "classes": [
            {**ubuntu, "boot_applications": ubuntu["boot_applications"][1:]},
            _learned(GDC),
            _learned(ARCH),
        ]
    }
    new = _config(tmp_path, "new.yaml", stricter)
    db = tmp_path / "state" / "nodegate.db"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    rc, out, err = await _run(["--config", str(new), "--current", str(current)], capsys)
    assert (rc, err) == (1, "")
    assert "would be refused (2):" in out
    assert "  gpu-0: measured_boot_violation" in out
    app = state["gpu-0"].measured_boot.boot_applications[0]  # type: ignore[union-attr]
    event = f"event {app.event[0]} (PCR 4, EV_EFI_BOOT_SERVICES_APPLICATION)"
    assert (
        f"    rule boot_applications: {event}: boot application {shim} is not allowed [class gce-ubuntu]"
        in out
    )
    assert "unchanged: 2 node(s)" in out
    assert "not judged, no boot record: 1 node(s): legacy" in out
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before  # read only
    rc, out, _ = await _run(
        ["--config", str(new), "--current", str(current), "--where", "node=cpu-*"], capsys
    )
    assert (rc, "unchanged: 1 node(s)" in out) == (0, True)
    rc, out, _ = await _run(["--config", str(new), "--current", str(current), "-o", "json"], capsys)
    doc = json.loads(out)
    refused = {c["node"]: c for c in doc["changes"] if c["kind"] == "refused"}
    assert set(refused) == {"gpu-0", "gpu-1"}
    assert refused["gpu-0"]["after"]["findings"][0] == {
        "rule": "boot_applications",
        "event": event,
        "class": "gce-ubuntu",
        "detail": f"boot application {shim} is not allowed",
    }


async def test_class_changes_and_newly_passing(
    tmp_path: Path, state: dict[str, BootRecord], capsys: pytest.CaptureFixture[str]
) -> None:
    # today: GDC's class requires a dbx entry its dbx lacks (so cpu-0 is refused at its next join)
    current = _config(
        tmp_path,
        "current.yaml",
        {"classes": [_learned(UBUNTU), _learned(GDC, dbx_required=["ab" * 32]), _learned(ARCH)]},
    )
    renamed = {**_learned(UBUNTU), "name": "ubuntu-2404"}
    new = _config(tmp_path, "new.yaml", {"classes": [renamed, _learned(GDC), _learned(ARCH)]})
    rc, out, _ = await _run(["--config", str(new), "--current", str(current)], capsys)
    assert rc == 0
    assert "would change class (2):" in out
    assert "  gpu-0: pcr -, measured boot gce-ubuntu -> pcr -, measured boot ubuntu-2404" in out
    assert "would newly pass (1):\n  cpu-0: passes as pcr -, measured boot gdc-host" in out


async def test_a_policy_the_stored_quotes_cannot_show_exits_3(
    tmp_path: Path, state: dict[str, BootRecord], capsys: pytest.CaptureFixture[str]
) -> None:
    """A PCR class on PCR 11, which the stored quotes did not cover: the next quote will, so the
    answer is unknown, not pass or refuse."""
    new = tmp_path / "new.yaml"
    golden = {"sha256": {11: ["00" * 32]}}
    new.write_text(
        yaml.safe_dump(
            {
                "state_dir": str(tmp_path / "state"),
                "pcr_policy": {"pcrs": [*PCRS, 11], "classes": [{"name": "x", "golden": golden}]},
            }
        )
    )
    rc, out, _ = await _run(["--config", str(new)], capsys)
    assert rc == 3
    assert "cannot tell from the record (4):" in out
    assert "the stored quote does not cover sha256:11" in out


async def test_measured_boot_alone_on_an_export(
    tmp_path: Path, state: dict[str, BootRecord], capsys: pytest.CaptureFixture[str]
) -> None:
    """The CI path: records exported once (kubectl nodegate boots -o json), a class file judged
    against them anywhere; a new dbx_required is judged with the dbx digests the export carries."""
    rows = tuple(kubectlboots.BootRow(n, r, None, r.boot_id, True, {}) for n, r in sorted(state.items()))
    dbx: dict[str, bytes] = {}
    for log in (UBUNTU, GDC, ARCH):
        dbx.update(_built(log, 0).dbx)
    export = tmp_path / "fleet.json"
    export.write_text(kubectlboots.render_json(kubectlboots.Boots(rows, dbx)))
    gpu_dbx = state["gpu-0"].measured_boot.dbx.sha256  # type: ignore[union-attr]
    wanted = dbx[gpu_dbx][:32]  # an entry of the Ubuntu nodes' dbx
    classes = tmp_path / "classes.yaml"
    classes.write_text(yaml.safe_dump({"classes": [{"name": "dbx", "dbx_required": [wanted.hex()]}]}))
    rc, out, _ = await _run(["--measured-boot", str(classes), "--records", str(export)], capsys)
    holders = {n for n, r in state.items() if _dbx_holds(r, dbx, wanted)}
    assert "gpu-0" in holders
    assert holders != set(state)
    assert rc == 1
    for node in sorted(set(state) - holders):
        assert f"  {node}: measured_boot_violation" in out
    assert "    rule dbx_required: (the log lacks it): dbx lacks 1 required entries" in out
    del_dbx = json.loads(export.read_text())
    del_dbx["dbx"] = {}
    export.write_text(json.dumps(del_dbx))
    rc, out, _ = await _run(["--measured-boot", str(classes), "--records", str(export)], capsys)
    assert rc in (1, 3)
    assert "are not at hand (dbx_required cannot be judged)" in out


def _dbx_holds(rec: BootRecord, dbx: dict[str, bytes], digest: bytes) -> bool:
    mb = rec.measured_boot
    if mb is None or mb.dbx is None:
        return False
    held = dbx[mb.dbx.sha256]
    return digest in {held[i : i + 32] for i in range(0, len(held), 32)}


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, "new.yaml", {})
    rc, _, err = _run_sync(["--config", str(cfg), "--measured-boot", str(cfg)], capsys)
    assert (rc, "exactly one of" in err) == (2, True)
    rc, _, err = _run_sync(["--config", str(cfg), "--where", "colour=blue"], capsys)
    assert (rc, "unknown field" in err) == (2, True)
    rc, _, err = _run_sync(["--config", str(cfg)], capsys)  # no store there yet
    assert (rc, "does not exist" in err) == (2, True)
    bad = tmp_path / "records.json"
    bad.write_text('{"nodes": [{"node": "x", "record": {"version": 7}}]}')
    rc, _, err = _run_sync(["--config", str(cfg), "--records", str(bad)], capsys)
    assert (rc, "not what `kubectl nodegate boots -o json` writes" in err) == (2, True)
    mb = tmp_path / "mb.yaml"
    mb.write_text(
        yaml.safe_dump(
            {"classes": [{"name": "c", "kernel_cmdlines": ["x"], "kernel_cmdline_chains": [["ab" * 32]]}]}
        )
    )
    cur = _config(tmp_path, "cur.yaml", {}, pcrs=list(range(8)))
    rc, _, err = _run_sync(["--measured-boot", str(mb), "--current", str(cur)], capsys)
    assert (rc, "needs PCR 8" in err) == (2, True)


def test_package_policies_what_would_now_be_denied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    current = tmp_path / "current.yaml"
    current.write_text(yaml.safe_dump(open_policy("open")))
    new = tmp_path / "new.yaml"
    new.write_text(
        yaml.safe_dump_all([p.model_dump(by_alias=True, exclude_none=True) for p in gpu_policies()])
    )
    over = copy.deepcopy(SAMPLE)
    over["metadata"]["name"] = "over-budget"
    over["spec"]["interruptionBudget"] = {"percent": 90}
    crs = tmp_path / "crs.yaml"
    crs.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [SAMPLE, over]}))
    rc, out, _ = _run_sync(
        ["--policy", str(new), "--current-policy", str(current), "--objects", str(crs)], capsys
    )
    assert rc == 1
    assert "would be denied (1):\n  Skyhook over-budget:" in out
    assert "budget" in out
    rc, out, _ = _run_sync(
        ["--policy", str(current), "--current-policy", str(new), "--objects", str(crs), "-o", "json"], capsys
    )
    doc = json.loads(out)
    assert (rc, doc["newlyDenied"], doc["newlyAllowed"]) == (
        0,
        [],
        [{"kind": "Skyhook", "name": "over-budget"}],
    )


def test_a_synthetic_record_without_a_log_is_refused_by_a_policy_that_needs_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node that sent no event log: any enforcing measured_boot refuses it at its next join,
    with the join's own words."""
    raw = el.build(el.boot())
    rec = bootrecords.built_from(None, bootrecords.quoted_of(raw, "sha256", PCRS)).record
    export = tmp_path / "fleet.json"
    export.write_text(json.dumps({"nodes": [{"node": "bare", "record": rec.to_obj()}]}))
    mb = tmp_path / "mb.yaml"
    mb.write_text(yaml.safe_dump({"secure_boot": "required"}))
    rc, out, _ = _run_sync(["--measured-boot", str(mb), "--records", str(export)], capsys)
    assert rc == 1
    assert "the node sent no event log" in out
