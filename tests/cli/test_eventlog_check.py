"""``nodegate eventlog check`` (one log against a measured_boot policy, the service's verdict) and
the self-check of ``nodegate policy learn`` (a class must accept every log it was learned from)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from attest import eventlog
from bootstrap import cli
from tests.support import realtpm

UBUNTU = "gce-ubuntu-2104-no-dbx.bin"  # the public test data's eventlogs/
RHEL = "gce-rhel8-uefi.bin"


def _write(tmp: Path, name: str, data: bytes) -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def _learn(
    tmp: Path, capsys: pytest.CaptureFixture[str], *logs: Path, cmdlines: bool = False
) -> tuple[int, str, str]:
    args = ["policy", "learn", "--name", "gce"]
    for log in logs:
        args += ["--event-log", str(log)]
    return _run(args + (["--kernel-cmdlines"] if cmdlines else []), capsys)


def _damaged_cmdline(raw: bytes) -> tuple[bytes, int]:
    """The log with one byte of a PCR 8 event's data changed: its digest (and the replay) stay,
    but the text no longer hashes to it, so its meaning is not proven."""
    log = eventlog.parse(raw)
    event = next(e for e in log.events if e.pcr == 8 and b"linux" in e.data)
    at = raw.index(event.data)
    return raw[:at] + bytes([event.data[0] ^ 0x20]) + raw[at + 1 :], event.number


def test_learned_from_two_distributions_accepts_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ubuntu = _write(tmp_path, "ubuntu.bin", realtpm.firmware_log(UBUNTU))
    rhel = _write(tmp_path, "rhel.bin", realtpm.firmware_log(RHEL))
    code, out, err = _learn(tmp_path, capsys, ubuntu, rhel)
    assert (code, err) == (0, "")
    policy = _write(tmp_path, "policy.yaml", out.encode())
    for log in (ubuntu, rhel):
        code, out, _ = _run(["eventlog", "check", "--policy", str(policy), "--event-log", str(log)], capsys)
        assert code == 0
        assert out.splitlines()[-1] == "verdict    accepted (class gce)"


def test_learn_refuses_to_write_a_class_that_refuses_its_own_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = realtpm.firmware_log(UBUNTU)
    damaged, number = _damaged_cmdline(raw)
    good = _write(tmp_path, "good.bin", raw)
    bad = _write(tmp_path, "bad.bin", damaged)
    code, out, err = _learn(tmp_path, capsys, good, bad, cmdlines=True)
    assert code == 1
    assert out == ""  # no policy is printed
    assert err.startswith("nodegate policy learn: self-check failed: the class would refuse")
    assert f"{bad}: refused [measured_boot_violation]" in err
    assert f"event {number} (PCR 8" in err
    assert str(good) + ":" not in err
    code, out, err = _learn(tmp_path, capsys, good, cmdlines=True)
    assert (code, err) == (0, "")
    assert yaml.safe_load(out)["measured_boot"]["classes"][0]["name"] == "gce"


def test_check_refuses_another_distribution_naming_the_event(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ubuntu = _write(tmp_path, "ubuntu.bin", realtpm.firmware_log(UBUNTU))
    code, out, _ = _learn(tmp_path, capsys, ubuntu)
    policy = _write(tmp_path, "policy.yaml", out.encode())
    rhel = _write(tmp_path, "rhel.bin", realtpm.firmware_log(RHEL))
    code, out, _ = _run(["eventlog", "check", "--policy", str(policy), "--event-log", str(rhel)], capsys)
    assert code == 1
    lines = out.splitlines()
    assert lines[1] == "pcrs       not given: judged as if a quote matched the log (sha256 0-9)"
    assert lines[2].startswith(
        "verdict    refused [measured_boot_violation]: the event log matches no enforced class"
    )
    assert "(PCR 4, EV_EFI_BOOT_SERVICES_APPLICATION)" in lines[2]


def test_check_with_quoted_pcrs_replays_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    att = realtpm.gce_attestation(realtpm.data("attestations/gce-cos-85-nonce9009.pb"))
    log = _write(tmp_path, "cos.bin", att.event_log)
    code, out, _ = _learn(tmp_path, capsys, log)
    policy = _write(tmp_path, "policy.yaml", out.encode())
    sha256 = {i: v for i, v in att.quotes[1].pcrs.items() if i < 10}
    pcrread = "sha256:\n" + "".join(
        f"  {i} : 0x{v.hex().upper()}\n" for i, v in sha256.items()
    )  # tpm2_pcrread
    pcrs = _write(tmp_path, "pcrs.yaml", pcrread.encode())
    args = ["eventlog", "check", "--policy", str(policy), "--event-log", str(log), "--pcrs", str(pcrs)]
    code, out, _ = _run(args, capsys)
    assert code == 0, out
    assert out.splitlines()[1] == "pcrs       sha256 0,1,2,3,4,5,6,7,8,9"
    forged = dict(sha256)
    forged[4] = bytes(32)
    _write(
        tmp_path, "pcrs.yaml", json.dumps({"sha256": {str(i): v.hex() for i, v in forged.items()}}).encode()
    )
    code, out, _ = _run(args, capsys)
    assert code == 1
    assert "refused [event_log_mismatch]: the event log replays sha256:4" in out


@pytest.mark.parametrize(
    ("policy", "pcrs", "needle"),
    [
        ("measured_boot: {classes: [{name: a, bogus: 1}]}", None, "--policy"),
        ("[", None, "not YAML"),
        ("measured_boot: {}", "sha999: {0: 00}", "is not a PCR bank"),
        ("measured_boot: {}", "sha256: {0: '0x01'}", "sha256 value is not 32 bytes"),
        ("measured_boot: {}", "sha256: {24: 0x01}", "is not 0-23"),
    ],
)
def test_check_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str, pcrs: str | None, needle: str
) -> None:
    log = _write(tmp_path, "log.bin", realtpm.firmware_log(UBUNTU))
    args = [
        "eventlog",
        "check",
        "--policy",
        str(_write(tmp_path, "p.yaml", policy.encode())),
        "--event-log",
        str(log),
    ]
    if pcrs is not None:
        args += ["--pcrs", str(_write(tmp_path, "pcrs.yaml", pcrs.encode()))]
    code, _, err = _run(args, capsys)
    assert code == 2
    assert needle in err


def test_check_names_a_file_that_is_not_an_event_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = _write(tmp_path, "p.yaml", b"measured_boot: {}\n")
    ima = _write(tmp_path, "ima.txt", realtpm.data("not-logs/ima-log-sha256.txt"))
    code, out, _ = _run(["eventlog", "check", "--policy", str(policy), "--event-log", str(ima)], capsys)
    assert code == 1
    assert "an IMA runtime measurement list" in out
    assert out.splitlines()[-1] == "verdict    refused [event_log_invalid]"


def test_learned_lists_carry_a_comment_saying_what_and_how_many(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rhel = _write(tmp_path, "rhel.bin", realtpm.firmware_log(RHEL))
    code, out, _ = _learn(tmp_path, capsys, rhel)
    assert code == 0
    cls = yaml.safe_load(out)["measured_boot"]["classes"][0]
    dbx = cls["dbx_required"]
    assert len(dbx) > 10
    lines = out.splitlines()
    at = lines.index("    dbx_required:")
    assert lines[at - 1] == (
        f"    # {len(dbx)} entries in the dbx of all 1 log(s): SHA-256s of revoked boot binaries and "
        "certificates; a node whose dbx lacks one is refused (stale revocations)"
    )
    at = lines.index("    boot_applications:")
    assert (
        lines[at - 1] == f"    # {len(cls['boot_applications'])} boot applications seen (PE image SHA-256s)"
    )
