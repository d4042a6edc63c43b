"""attest.eventlog: real logs from public sources against tpm2_eventlog, replay against shipped PCR
values, and every way a log can be forged or broken refused with its code."""

from __future__ import annotations

import base64
import json
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attest import bootevents, eventlog
from attest.errors import AttestationError, EventLogInvalid, EventLogMismatch
from tests.support import eventlogs as el
from tests.support.certs import self_signed

DATA = Path(__file__).parent / "data" / "eventlogs"
PROVENANCE = json.loads((DATA / "PROVENANCE.json").read_text())
REAL = sorted(e["file"] for e in PROVENANCE["files"] if not e["file"].endswith(".json"))
GO_EVENTLOG = json.loads((DATA / "go-eventlog-pcrs.json").read_text())
# tpm2_eventlog refuses or crashes on these while go-attestation parses them (tests below).
TPM2_EVENTLOG_WRONG = {"specid-vendordata.bin", "option_rom_eventlog", "short_no_action_eventlog"}


def _tpm2_eventlog(path: Path) -> tuple[int, dict[str, Any], str]:
    """Event count, replayed PCRs and raw text. For SHA-1-only logs tpm2_eventlog prints the
    events as one mapping with repeated keys (not YAML), so events are counted by their lines."""
    out = subprocess.run(["tpm2_eventlog", str(path)], capture_output=True, text=True, check=True, timeout=60)
    count = sum(
        1 for line in out.stdout.splitlines() if line.strip().removeprefix("- ").startswith("PCRIndex:")
    )
    pcrs_text = out.stdout.partition("\npcrs:\n")[2]
    pcrs = yaml.safe_load("pcrs:\n" + pcrs_text)["pcrs"] if pcrs_text else {}
    return count, pcrs or {}, out.stdout


def test_every_file_has_its_provenance() -> None:
    files = {p.name for p in DATA.iterdir()} - {"PROVENANCE.json", "go-eventlog-pcrs.json"}
    assert files == {e["file"] for e in PROVENANCE["files"]}
    for entry in PROVENANCE["files"]:
        for src in entry["sources"]:
            assert len(src["commit"]) == 40
            assert src["repo"]
            assert src["path"]


def test_tpm2_eventlog_is_installed() -> None:
    """The comparison below needs Debian's tpm2-tools (make deps installs it): never skipped."""
    assert shutil.which("tpm2_eventlog"), "install tpm2-tools (make deps)"


@pytest.mark.parametrize("name", [n for n in REAL if n not in TPM2_EVENTLOG_WRONG])
def test_real_logs_agree_with_tpm2_eventlog(name: str) -> None:
    log = eventlog.parse((DATA / name).read_bytes())
    count, pcrs, text = _tpm2_eventlog(DATA / name)
    assert len(log.events) == count
    if log.spec is not None:
        listed = [line.split(":")[1].strip() for line in text.splitlines() if "algorithmId:" in line]
        assert list(log.banks) == [b for b in listed if b in ("sha1", "sha256", "sha384", "sha512")]
    replayed = log.replay()
    for bank, values in pcrs.items():
        assert set(replayed[bank]) == {int(i) for i in values}
        for index, value in values.items():  # YAML reads 0x... as an integer
            if int(index) == 0 and log.startup_locality is not None:
                continue  # tpm2_eventlog ignores StartupLocality: go-eventlog's values below decide
            assert int.from_bytes(replayed[bank][int(index)], "big") == value, (bank, index)
    # The Secure Boot verdict: tpm2_eventlog shows the SecureBoot variable's data as logged.
    chunks = text.split("PCRIndex:")
    shown = [c for c in chunks if "UnicodeName: SecureBoot" in c and "EV_EFI_VARIABLE_DRIVER_CONFIG" in c]
    if not shown:
        assert log.secure_boot is None
    else:
        parts = shown[-1].split("VariableData:")  # absent when the variable is empty
        data = parts[1].split()[0].strip('"').lower() if len(parts) > 1 else ""
        assert log.secure_boot is (data in ("01", "1"))


@pytest.mark.parametrize("entry", GO_EVENTLOG["logs"], ids=lambda e: e["log"])
def test_real_logs_replay_to_the_pcrs_go_eventlog_expects(entry: dict[str, Any]) -> None:
    log = eventlog.parse((DATA / entry["log"]).read_bytes())
    quoted = {
        bank: {int(i): bytes.fromhex(v) for i, v in values.items()} for bank, values in entry["pcrs"].items()
    }
    eventlog.verify_replay(log, quoted)
    bank = next(iter(quoted))
    index = next(iter(quoted[bank]))
    quoted[bank][index] = bytes(len(quoted[bank][index]))
    with pytest.raises(EventLogMismatch):
        eventlog.verify_replay(log, quoted)


def test_a_lone_startup_locality_event_is_a_log() -> None:
    """go-attestation's TestParseShortNoAction: a SHA-1 log of one StartupLocality record
    (tpm2_eventlog refuses it as a bad Spec ID event)."""
    log = eventlog.parse((DATA / "short_no_action_eventlog").read_bytes())
    assert (len(log.events), log.startup_locality, log.replay()) == (1, 3, {"sha1": {}})


def test_option_rom_log_replays_to_the_pcrs_go_attestation_ships() -> None:
    """tpm2_eventlog 5.x crashes on this log (an EV_NO_ACTION record filed under PCR 0xFFFFFFFF);
    go-attestation's TestSecureBootOptionRom (attest/secureboot_test.go) lists its SHA-1 PCRs."""
    pcrs = [
        "AVGK7ch6DvUF0nJh74NYCefaAIY=", "vr/0wIpmd0c6tgTO3vuC+FDN6IM=", "NmoxoMB1No8OEIVzM+ou1uigD9M=",
        "sqg7Dr8vg3Qpmlsr38MeqVWtcjY=", "OfOIw5WekEaUcm9MAVttzq4GgKE=", "cjoFIM9/KXhUh0K9FUFwayRGRZ4=",
        "sqg7Dr8vg3Qpmlsr38MeqVWtcjY=", "IN59+6a838ytrX4+sJnJHU2Xxa0=",
    ]  # fmt: skip
    log = eventlog.parse((DATA / "option_rom_eventlog").read_bytes())
    quoted = {"sha1": {i: base64.b64decode(v) for i, v in enumerate(pcrs)}}
    eventlog.verify_replay(log, quoted)
    assert log.secure_boot is True
    facts = bootevents.facts(log.events, bank="sha1", pcrs=range(8))
    assert [a.subject for a in facts.authorities] == [
        "CN=Microsoft Corporation UEFI CA 2011,O=Microsoft Corporation,L=Redmond,ST=Washington,C=US",
        "CN=Microsoft Windows Production PCA 2011,O=Microsoft Corporation,L=Redmond,ST=Washington,C=US",
    ]
    quoted["sha1"][4] = bytes(20)
    with pytest.raises(EventLogMismatch, match="sha1:4"):
        eventlog.verify_replay(log, quoted)


def test_windows_log_replays_to_its_shipped_pcrs() -> None:
    doc = json.loads((DATA / "windows_gcp_shielded_vm.json").read_text())
    log = eventlog.parse(base64.b64decode(doc["Log"]["Raw"]))
    quoted = {"sha1": {p["Index"]: base64.b64decode(p["Digest"]) for p in doc["Log"]["PCRs"]}}
    assert sorted(quoted["sha1"]) == list(range(24))
    eventlog.verify_replay(log, quoted)


def test_vendor_info_beyond_the_event_is_refused() -> None:
    """tpm2-tools' own fixture declares a 37-byte Spec ID event and puts 4 bytes of vendor info
    after it; tpm2_eventlog reads past the event. The bytes belong to no event: refused."""
    with pytest.raises(EventLogInvalid, match="vendor info"):
        eventlog.parse((DATA / "specid-vendordata.bin").read_bytes())


def test_old_shim_authority_events_verify_over_their_covered_bytes() -> None:
    log = eventlog.parse((DATA / "debian-10.bin").read_bytes())
    facts = bootevents.facts(log.events, bank="sha1")
    assert facts.unverified == ()
    assert [a.subject for a in facts.authorities][-1] == "CN=Debian Secure Boot CA"


# -- synthetic logs: replay and every forgery ------------------------------------------------------


def _quote(
    events: list[el.Ev], bank: str = "sha256", locality: int | None = None
) -> dict[str, dict[int, bytes]]:
    values = el.replay(events, bank, locality=locality)
    return {bank: {i: values.get(i, bytes(32)) for i in range(10)}}


def test_a_built_log_replays_and_shows_its_facts() -> None:
    _, cert = self_signed("Test Secure Boot CA")
    events = el.boot(cert_der=cert.public_bytes(serialization.Encoding.DER))
    log = eventlog.parse(el.build(events))
    eventlog.verify_replay(log, _quote(events))
    assert log.banks == ("sha1", "sha256")
    assert log.secure_boot is True
    facts = bootevents.facts(log.events, bank="sha256", pcrs=range(10))
    assert [c.text for c in facts.kernel_cmdlines] == ["/vmlinuz-6.8 root=/dev/sda1 ro"]
    assert [c.text for c in facts.grub_commands] == ["linux /vmlinuz-6.8 root=/dev/sda1 ro"]
    assert next(a.path for a in facts.boot_applications) == "\\EFI\\ubuntu\\shimx64.efi"
    assert facts.dbx_digests() == {"aa" * 32, "bb" * 32}
    assert [a.subject for a in facts.authorities] == ["CN=Test Secure Boot CA"]
    assert facts.unverified == ()


def test_startup_locality_sets_pcr0_before_the_first_extend() -> None:
    events = el.boot()
    log = eventlog.parse(el.build(events, locality=3))
    assert log.startup_locality == 3
    eventlog.verify_replay(log, _quote(events, locality=3))
    with pytest.raises(EventLogMismatch, match="sha256:0"):
        eventlog.verify_replay(log, _quote(events))


def test_data_that_does_not_hash_to_its_digest_shows_nothing() -> None:
    """A forger keeps the digest of "Secure Boot off" (so the replay still matches the quote) and
    writes "on" into the data: the event is unverified and Secure Boot is unknown, not on."""
    events = el.boot(secure=False)
    quote = _quote(events)
    forged = el.secure_boot(True)
    forged.digests = {b: events[2].digest(b) for b in ("sha1", "sha256")}
    events[2] = forged
    log = eventlog.parse(el.build(events))
    eventlog.verify_replay(log, quote)  # the digests are untouched
    facts = bootevents.facts(log.events, bank="sha256", pcrs=range(10))
    assert facts.secure_boot is None
    assert log.secure_boot is None
    assert [e.number for e in facts.unverified] == [3]


def test_a_forged_kernel_command_line_is_unverified() -> None:
    events = el.boot()
    quote = _quote(events)
    cmdline = next(i for i, e in enumerate(events) if e.data.startswith(b"kernel_cmdline"))
    real = events[cmdline]
    events[cmdline] = el.Ev(
        8, el.EV_IPL, b"kernel_cmdline: harmless\x00", digests={b: real.digest(b) for b in ("sha1", "sha256")}
    )
    log = eventlog.parse(el.build(events))
    eventlog.verify_replay(log, quote)
    facts = bootevents.facts(log.events, bank="sha256", pcrs=range(10))
    assert facts.kernel_cmdlines == ()
    assert [e.type_name for e in facts.unverified] == ["EV_IPL"]


@pytest.mark.parametrize("change", ["tamper", "drop", "reorder", "lie"])
def test_a_changed_log_no_longer_replays_to_the_quote(change: str) -> None:
    events = el.boot()
    quote = _quote(events)
    if change == "tamper":  # other data and its honest digest
        events[12] = el.application(b"\x44" * 32)
    elif change == "drop":
        del events[13]
    elif change == "reorder":  # two events of PCR 4
        events[12], events[13] = events[13], events[12]
    else:  # a digest that is not what the TPM was extended with
        events[1].digests = {"sha256": b"\x00" * 32}
    log = eventlog.parse(el.build(events))
    with pytest.raises(EventLogMismatch) as info:
        eventlog.verify_replay(log, quote)
    assert info.value.code == "event_log_mismatch"


def test_events_in_unquoted_pcrs_are_not_facts() -> None:
    events = el.boot()
    log = eventlog.parse(el.build(events))
    facts = bootevents.facts(log.events, bank="sha256", pcrs=range(8))
    assert facts.kernel_cmdlines == ()
    assert facts.grub_commands == ()
    assert {e.pcr for e in facts.uncovered} == {8}


def test_a_quoted_bank_the_log_lacks_is_a_mismatch() -> None:
    log = eventlog.parse(el.build(el.boot(), banks=("sha1",)))
    with pytest.raises(EventLogMismatch, match="no sha256 digests"):
        eventlog.verify_replay(log, {"sha256": {0: bytes(32)}})


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"\x00" * 10, "ends inside"),
        (el.build(el.boot()) + b"\x00", "ends inside"),
        (el.build(el.boot())[:-3], "claims"),
        (el.build([el.Ev(24, el.EV_IPL, b"x")]), "PCR 24"),
        (el.build(el.boot()) + b"\xff" * 64, "PCR"),
        (b"\x00" * (eventlog.MAX_LOG_BYTES + 1), "larger than"),
    ],
)
def test_broken_logs_are_invalid(data: bytes, reason: str) -> None:
    with pytest.raises(EventLogInvalid, match=reason) as info:
        eventlog.parse(data)
    assert info.value.code == "event_log_invalid"


def test_too_many_events_are_refused() -> None:
    events = [el.Ev(9, el.EV_IPL, b"")] * eventlog.MAX_EVENTS
    with pytest.raises(EventLogInvalid, match="more than"):
        eventlog.parse(el.build(events, banks=("sha1",)))


def test_digest_for_a_bank_the_spec_id_does_not_list_is_refused() -> None:
    data = bytearray(el.build([el.Ev(4, el.EV_IPL, b"x")], banks=("sha256",)))
    spec_len = struct.unpack_from("<I", data, 28)[0]
    at = 32 + spec_len + 12  # first agile event: pcr, type, count, then the algorithm id
    data[at : at + 2] = struct.pack("<H", 0x0004)
    with pytest.raises(EventLogInvalid, match="not a bank of this log"):
        eventlog.parse(bytes(data))


# -- no input raises anything but AttestationError --------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_raise_only_event_log_invalid(data: bytes) -> None:
    try:
        log = eventlog.parse(data)
    except EventLogInvalid:  # anything else would escape and fail the test
        return
    log.replay()
    bank = bootevents.preferred_bank(log.banks)
    if bank:
        bootevents.facts(log.events, bank=bank)


_SAMPLES = [(DATA / n).read_bytes() for n in ("event-moklisttrusted.bin", "debian-10.bin", "glinux-alex.bin")]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, len(_SAMPLES) - 1),
    at=st.integers(0, 40_000),
    flips=st.binary(min_size=1, max_size=4),
    cut=st.integers(0, 8),
)
def test_mutated_real_logs_raise_only_attestation_errors(which: int, at: int, flips: bytes, cut: int) -> None:
    data = bytearray(_SAMPLES[which])
    at %= len(data)
    data[at : at + len(flips)] = flips
    if cut:
        del data[-cut:]
    try:
        log = eventlog.parse(bytes(data))
    except EventLogInvalid:
        return
    bank = bootevents.preferred_bank(log.banks)
    assert bank is not None
    bootevents.facts(log.events, bank=bank)
    with pytest.raises(AttestationError):
        eventlog.verify_replay(
            log, {bank: {i: b"\x01" * len(log.events[1].digests.get(bank, b"x" * 20)) for i in range(8)}}
        )
