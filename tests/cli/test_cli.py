"""The command line: the README's demo tells its story (and fails in one line); stubs say what is missing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bootstrap import cli


@pytest.mark.swtpm
def test_demo_tells_the_whole_story(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    out = captured.out
    lines = out.splitlines()
    assert [line.split(" ")[0] for line in lines if line.startswith("[")] == [
        f"[{n}/12]" for n in range(1, 13)
    ]
    assert "emulated Kubernetes API (kmock)" in out
    assert "swtpm: emulated TPM hardware" in out
    # SPIFFE IDs from the SVIDs that `nodegate join` wrote, and kubelet certificates via the CSR API
    for n in (1, 2, 3):
        assert f"gpu-node-{n}: spiffe://demo.nodegate.test/node/gpu-node-{n}  (X.509-SVID until " in out
        assert f"kubelet certificate CN=system:node:gpu-node-{n},O=system:nodes" in out
    assert "spiffe://demo.nodegate.test/node/gpu-node-4" not in out
    # measured boot: every machine's TPM measured a boot and its log went with the join
    assert "20 events (Secure Boot on, db CA O=nodegate demo,CN=nodegate demo UEFI CA" in out
    assert "--event-log boot/gpu-node-1/binary_bios_measurements" in out
    assert "each kubelet reports its boot id (status.nodeInfo.bootID)" in out
    # the tampered node: refused with its code, in the one line `nodegate join` prints, which
    # names the event (number, PCR, type) and the rule it broke
    assert "refused: measured_boot_violation (HTTP 403)" in out
    (refusal,) = [x for x in lines if "nodegate join: refused (measured_boot_violation, HTTP 403): " in x]
    assert "class demo-linux: event 20 (PCR 4, EV_EFI_BOOT_SERVICES_APPLICATION): boot application " in (
        refusal
    )
    assert "(\\vmlinuz-6.9.0-unknown) is not allowed (rule boot_applications)" in refusal
    # the gate: every node held, then two released and the failed one held
    assert "3 nodes: 0 released; held: packages-pending 3;" in out
    assert out.count("held: nodegate.io/hold=packages-pending; phase Held") == 3
    assert "3 nodes: 2 released; held: validation-failed 1;" in out
    for n in (1, 2):
        assert f"gpu-node-{n}: released: hold taint removed; phase Ready" in out
    assert "gpu-node-3: held: nodegate.io/hold=validation-failed; phase Held" in out
    # a reboot: the TPM reset, the gate holds the node as rebooted, `nodegate attest` proves the
    # new boot (resetCount grew) and the gate releases it, each phase timed
    assert "[8/12] NodeWright reboots gpu-node-1 for a package with a reboot interrupt" in out
    assert "3 nodes: 1 released; held: unattested 1, validation-failed 1;" in out
    held = "gpu-node-1: held: nodegate.io/hold=unattested; unattested: rebooted since its last attestation"
    assert f"{held} (boot " in out
    resets = re.search(r"attested this boot \(renewed\); resetCount (\d+) -> (\d+): [0-9.]+ s", out)
    assert resets is not None
    assert int(resets.group(2)) > int(resets.group(1))
    assert re.search(r"gpu-node-1: released again, [0-9.]+ s after its reboot began", out)
    # the webhook: allowed and denied, with the reasons
    assert "alice (ml-platform) applies it: /admission/mutate adds 2 hold tolerations" in out
    assert out.count("ALLOWED  ") == 2
    assert "ALLOWED  alice (ml-platform) creates NodeWright gpu-stack (PackagePolicy demo-fleet)" in out
    assert out.count("DENIED   ") == 4
    assert "mallory lacks verb deploy on packagepolicies/demo-fleet" in out
    assert "docker.io/someone/gpu-driver is not under an allowed registry" in out
    assert "budget exceeds the pool's 50%" in out
    assert "alice lacks verb reboot on packagepolicies/demo-fleet" in out
    assert "only nodegate may remove or change the nodegate.io/hold taint" in out
    # a CR written without hold tolerations: skipped as written, mutated, admitted, picked, its
    # package complete, and the held node released
    assert (
        "Skyhook hello-hosts: one shellscript package (motd), the shape of NodeWright's simplest "
        "example; applied as written"
    ) in out
    assert (
        "as written, NodeWright would skip it (TaintNotTolerable: "
        "nodegate.io/hold=validation-failed:NoSchedule)" in out
    )
    assert (
        "POST /admission/mutate: JSONPatch adds 2 tolerations, nothing else: "
        "nodegate.io/hold=packages-pending:NoSchedule, nodegate.io/hold=validation-failed:NoSchedule"
    ) in out
    assert "ALLOWED  alice (ml-platform) creates Skyhook hello-hosts (PackagePolicy first-packages)" in out
    assert "NodeWright picks gpu-node-3; its package pod hello-hosts-motd-1-0-0-apply-gpu-node-3-" in out
    assert "3 nodes: 3 released; held: none;" in out
    assert "gpu-node-3: released: hold taint removed; packages of gpu-stack and hello-hosts complete" in out
    assert lines[-1].startswith("demo complete in ")
    assert lines[-1].endswith(
        "3 nodes attested, 1 refused (measured_boot_violation), gate released 2 and held 1 "
        "(validation-failed), 1 rebooted and re-attested (gpu-node-1), webhook allowed 3 CRs "
        "(steps 6, 9, 10) and denied 4 (step 9), the sample CR given 2 hold tolerations reached "
        "and released gpu-node-3: 3 of 3 nodes released"
    )
    # cleaned up: the temp dir is gone and no process still uses it
    # a what-if of a stricter policy names every node it would refuse, with the rule and event
    assert "[11/12] before a stricter policy goes out: `nodegate policy whatif` on the attested boots" in out
    assert "would be refused (3):" in out
    for n in (1, 2, 3):
        assert f"gpu-node-{n}: measured_boot_violation" in out
    assert "rule dbx_required: (the log lacks it): dbx lacks 1 required entries, e.g. 80b4d969" in out
    (cleanup,) = [line for line in lines if line.startswith("[12/12]")]
    tmp = cleanup.rsplit(", ", 1)[1]
    assert "nodegate-demo-" in tmp
    assert not Path(tmp).exists()
    assert _processes_using(tmp) == []


def _processes_using(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:  # the process ended meanwhile
            continue
        if any(text.encode() in a for a in args):
            found.append(b" ".join(args).decode(errors="replace"))
    return found


def test_demo_failure_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no swtpm tools: the first step fails
    assert cli.main(["demo"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("nodegate demo: failed: ")
    assert "not installed; run `make deps`" in err


def test_every_command_is_built(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 0
    assert "not built yet" not in capsys.readouterr().out
    with pytest.raises(SystemExit) as usage:
        cli.main(["backup"])  # --config/--out missing: argparse's usage error
    assert usage.value.code == 2
    assert "--out" in capsys.readouterr().err
