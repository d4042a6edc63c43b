"""Real firmware event logs (the public test data's eventlogs/, provenance in MANIFEST.json): physical
servers, workstations and laptops, Google Compute Engine vTPMs (Shielded and Confidential VMs),
OVMF virtual machines, SHA-1-only and crypto-agile logs, an H-CRTM platform with an SM3-256 bank.

Every one parses and replays in every bank; where Debian's ``tpm2_eventlog`` (an independent
parser) reads it, the event count and every replayed PCR agree (PCR 0 aside where the platform's
locality applies: tpm2_eventlog ignores it); the H-CRTM log's PCR 0 equals the value tpm2-tss's
own test expects; and every boot log is fully interpreted in the PCRs the policy judges, so a
class learned from it admits it. Hypothesis mutates the real logs' bytes: only
``event_log_invalid`` ever escapes, and the interpreter never raises.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attest import eventlog
from attest.errors import EventLogInvalid
from attest.measuredboot import events as typed
from attest.measuredboot import facts as bootfacts
from attest.measuredboot import policy as measuredboot
from attest.measuredboot.tcglog import EV_NO_ACTION, hasher
from tests.support.shared_data import shared

DATA = shared("eventlogs")
DATA.require()  # every test here reads the real logs: the module skips (one line) without them
FOLDER = DATA.path
LOGS = DATA.names()
# Not the log of a boot: go-attestation's 49-byte sample holds one StartupLocality record.
NOT_A_BOOT = {"go-attestation-short-no-action.bin"}
# tpm2-tools 5.x cannot read these two (it segfaults on the EV_NO_ACTION under PCR 0xFFFFFFFF of
# the option ROM log, and refuses a SHA-1 log opening with StartupLocality).
TPM2_EVENTLOG_FAILS = {"go-attestation-option-rom.bin", "go-attestation-short-no-action.bin"}
# tpm2-tss test/unit/fapi-eventlog.c (check_bios_hcrtm): PCR 0 of binary_measurements_hcrtm, sha1.
HCRTM_SHA1_PCR0 = "15f4e6ca457d1af6bc49511a93ba3500ad69acc5"


@cache
def _data(name: str) -> bytes:
    return DATA.read(name)


@cache
def _log(name: str) -> eventlog.EventLog:
    return eventlog.parse(_data(name))


def test_the_manifest_lists_every_fixture_with_its_provenance() -> None:
    on_disk = sorted(p.name for p in FOLDER.iterdir() if p.name != "MANIFEST.json")
    assert on_disk == LOGS
    assert len(LOGS) >= 20
    for entry in json.loads((FOLDER / "MANIFEST.json").read_text())["logs"]:
        assert hashlib.sha256(_data(entry["file"])).hexdigest() == entry["sha256"], entry["file"]
        assert entry["source"].startswith("https://github.com/")
        assert len(entry["commit"]) == 40
        assert entry["path"]
        assert entry["licence"]
        assert entry["fetched"]


def test_the_corpus_spans_formats_and_platforms() -> None:
    banks = {b for name in LOGS for b in _log(name).banks}
    assert {"sha1", "sha256", "sha384", "sm3_256"} <= banks
    assert any(_log(n).spec is None for n in LOGS)  # SHA-1-only (TCG_PCClientPCREvent) logs
    assert any(_log(n).hcrtm for n in LOGS)
    assert any(_log(n).startup_locality == 3 for n in LOGS)


@pytest.mark.parametrize("name", LOGS)
def test_every_real_log_parses_and_replays_in_every_bank(name: str) -> None:
    log = _log(name)
    replayed = log.replay()
    assert set(replayed) == set(log.banks)
    for bank, values in replayed.items():
        independent = _replay(log, bank)
        assert values == independent, bank


def _replay(log: eventlog.EventLog, bank: str) -> dict[int, bytes]:
    """Extend every event's digest, with hashlib, from the platform's reset values."""
    name = {"sm3_256": "sm3"}.get(bank, bank)
    size = hashlib.new(name).digest_size
    pcrs: dict[int, bytes] = {}
    for ev in log.events:
        if ev.type == EV_NO_ACTION or bank not in ev.digests:
            continue
        start = bytes(size)
        if ev.pcr == 0 and log.pcr0_locality:
            start = bytes(size - 1) + bytes([log.pcr0_locality])
        pcrs[ev.pcr] = hashlib.new(name, pcrs.get(ev.pcr, start) + ev.digests[bank]).digest()
    return pcrs


def _tpm2_eventlog(path: Path) -> tuple[int, dict[str, Any], str]:
    out = subprocess.run(["tpm2_eventlog", str(path)], capture_output=True, text=True, check=True, timeout=60)
    count = sum(
        1 for line in out.stdout.splitlines() if line.strip().removeprefix("- ").startswith("PCRIndex:")
    )
    pcrs_text = out.stdout.partition("\npcrs:\n")[2]
    pcrs = yaml.safe_load("pcrs:\n" + pcrs_text)["pcrs"] if pcrs_text else {}
    return count, pcrs or {}, out.stdout


def _sp800_155(log: eventlog.EventLog) -> bool:
    return any(ev.type == EV_NO_ACTION and ev.data.startswith(b"SP800-155 Event3") for ev in log.events)


@pytest.mark.parametrize("name", sorted(set(LOGS) - TPM2_EVENTLOG_FAILS))
def test_real_logs_agree_with_tpm2_eventlog(name: str) -> None:
    assert shutil.which("tpm2_eventlog"), "install tpm2-tools (make deps)"
    log = _log(name)
    count, pcrs, _ = _tpm2_eventlog(DATA.file(name))
    assert len(log.events) == count
    replayed = log.replay()
    compared = 0
    for bank, values in pcrs.items():
        for index, value in values.items():
            if int(index) == 0 and (log.pcr0_locality or _sp800_155(log)):
                # tpm2_eventlog starts PCR 0 at zero whatever the locality, and extends the
                # EV_NO_ACTION "SP800-155 Event3" records (never extended: PFP 10.4.5)
                continue
            assert int.from_bytes(replayed[bank][int(index)], "big") == value, (bank, index)
            compared += 1
    assert compared


def test_the_hcrtm_log_replays_pcr0_from_locality_4_in_every_bank() -> None:
    """TCG PFP and TPM 2.0 Part 1 section 34.3: an H-CRTM resets PCR 0 to 00..04 and extends its
    digest first. tpm2-tss's test expects this sha1 value for the same log."""
    log = _log("tss-hcrtm.bin")
    assert log.hcrtm
    assert log.startup_locality is None
    first = next(ev for ev in log.events if ev.pcr == 0 and ev.type != EV_NO_ACTION)
    assert (first.type_name, first.data) == ("EV_EFI_HCRTM_EVENT", b"HCRTM")
    replayed = log.replay()
    assert replayed["sha1"][0].hex() == HCRTM_SHA1_PCR0
    assert set(replayed) == {"sha1", "sha256", "sm3_256"}
    for bank in replayed:
        size = len(first.digests[bank])
        after_hcrtm = hasher(bank)(bytes(size - 1) + b"\x04" + first.digests[bank]).digest()
        from_zero = hasher(bank)(bytes(size) + first.digests[bank]).digest()
        assert after_hcrtm != from_zero
        rest = [ev.digests[bank] for ev in log.events if ev.pcr == 0 and ev.type != EV_NO_ACTION][1:]
        value = after_hcrtm
        for digest in rest:
            value = hasher(bank)(value + digest).digest()
        assert replayed[bank][0] == value, bank
    eventlog.verify_replay(
        log, {"sm3_256": {0: replayed["sm3_256"][0]}, "sha256": {0: replayed["sha256"][0]}}
    )


@pytest.mark.parametrize("name", sorted(set(LOGS) - NOT_A_BOOT))
def test_every_real_boot_is_fully_interpreted_where_rules_look(name: str) -> None:
    """A real log that upstream tools accept keeps its verdict under the strict interpreter: no
    event in PCRs 4, 7 and 8 lacks a vouched-for meaning, and a class learned from the log (every
    rule, command lines included) admits it."""
    log = _log(name)
    bank = bootfacts.preferred_bank(log.banks)
    assert bank is not None
    facts = bootfacts.facts(log.events, bank=bank, pcrs=range(10))
    assert facts.uninterpreted == (), [(u.where(), u.reason) for u in facts.uninterpreted]
    assert facts.secure_boot is log.secure_boot is not None
    if bank != "sha256":
        return  # a SHA-1-only log: boot_applications rules are written in sha256
    learned = measuredboot.learn([facts], name="real", cmdlines=True)
    policy = measuredboot.MeasuredBootPolicy(classes=(learned,))
    assert measuredboot.enforce(policy, facts).matched_class == "real"


def test_the_short_sample_is_refused_by_pcr7_rules_as_documented() -> None:
    """go-attestation's one-record sample has no PCR 7 at all: a PCR 7 rule cannot hold."""
    facts = bootfacts.facts(_log("go-attestation-short-no-action.bin").events, bank="sha1", pcrs=range(10))
    result = measuredboot.evaluate(measuredboot.policy_from_obj({"secure_boot": "required"}), facts)
    assert not result.ok
    assert "PCR 7 has no separator" in result.reason


def test_real_grub_and_systemd_boot_command_lines_are_read() -> None:
    """Upstream grub (Ubuntu, COS), RHEL's older grub and systemd-boot (one from before v246 that
    logged a byte less than it measured) each give their kernel command line."""
    seen = {}
    for name in (
        "gce-ubuntu-2104-no-dbx.bin",
        "gce-rhel8-uefi.bin",
        "arch-linux-workstation.bin",
        "gce-cos-85-amd-sev.bin",
    ):
        log = _log(name)
        facts = bootfacts.facts(
            log.events, bank="sha256" if "sha256" in log.banks else "sha1", pcrs=range(10)
        )
        (line,) = facts.kernel_cmdlines
        seen[name] = line.text
    assert seen["gce-ubuntu-2104-no-dbx.bin"].startswith("/boot/vmlinuz-5.11.0-1008-gcp root=")
    assert seen["gce-rhel8-uefi.bin"].startswith("(hd0,gpt2)/boot/vmlinuz-4.18.0-240.22.1.el8_3.x86_64 ")
    assert seen["arch-linux-workstation.bin"].startswith(
        "initrd=\\intel-ucode.img initrd=\\initramfs-linux-lts.img "
    )
    assert seen["gce-cos-85-amd-sev.bin"].startswith("/syslinux/vmlinuz.A init=/usr/lib/systemd/systemd ")


# -- fuzz: the interpreter on real log shapes -------------------------------------------------------

_FUZZED = sorted(set(LOGS) - NOT_A_BOOT)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, len(_FUZZED) - 1),
    at=st.integers(0, 80_000),
    flips=st.binary(min_size=1, max_size=8),
    cut=st.integers(0, 16),
)
def test_mutated_real_logs_raise_only_event_log_invalid(which: int, at: int, flips: bytes, cut: int) -> None:
    data = bytearray(_data(_FUZZED[which]))
    at %= len(data)
    data[at : at + len(flips)] = flips
    if cut:
        del data[-cut:]
    try:
        log = eventlog.parse(bytes(data))
    except EventLogInvalid:
        return
    bank = bootfacts.preferred_bank(log.banks)
    assert bank is not None
    facts = bootfacts.facts(log.events, bank=bank, pcrs=range(24))
    policy = measuredboot.policy_from_obj(
        {
            "secure_boot": "required",
            "classes": [
                {
                    "name": "x",
                    "authorities": [],
                    "kernel_cmdlines": [],
                    "kernel_cmdline_chains": [["11" * 32]],
                }
            ],
        }
    )
    measuredboot.evaluate(policy, facts)
    for a in facts.authorities:
        assert a.subject is None or a.subject
    for ev in log.events:
        typed.interpret(ev, bank)
