"""attest.eventlog: real logs from public sources against tpm2_eventlog, replay against shipped PCR
values, and every way a log can be forged or broken refused with its code."""

from __future__ import annotations

import functools
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

from attest import eventlog
from attest.errors import AttestationError, EventLogInvalid, EventLogMismatch
from attest.measuredboot import facts as bootfacts
from tests.support import eventlogs as el
from tests.support.certs import self_signed


# The certificate and the logs that carry it are made when a test first asks (functools.cache), not
# at import: a refusal by the installed cryptography fails those tests, not the collection.
@functools.cache
def cert_der() -> bytes:
    _, cert = self_signed("Test Secure Boot CA")
    return cert.public_bytes(serialization.Encoding.DER)


@functools.cache
def quirky_logs() -> dict[str, bytes]:
    return el.quirky(cert_der())


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


def test_tpm2_eventlog_is_installed() -> None:
    """The comparison below needs Debian's tpm2-tools (make deps installs it): never skipped."""
    assert shutil.which("tpm2_eventlog"), "install tpm2-tools (make deps)"


# tpm2_eventlog 5.x fails on these two shapes that real firmware writes (go-attestation parses
# both): it crashes on an EV_NO_ACTION record under PCR 0xFFFFFFFF and refuses a SHA-1 log that
# opens with a StartupLocality record ("invalid eventDataSize in specid event").
TPM2_EVENTLOG_FAILS = {"no-action-pcr-ffffffff", "sha1-only-locality"}


def test_tpm2_eventlog_fails_where_we_parse(tmp_path: Path) -> None:
    for name in sorted(TPM2_EVENTLOG_FAILS):
        (tmp_path / name).write_bytes(quirky_logs()[name])
        done = subprocess.run(
            ["tpm2_eventlog", str(tmp_path / name)], check=False, capture_output=True, timeout=60
        )
        assert done.returncode != 0, name
        assert eventlog.parse(quirky_logs()[name]).events


@pytest.mark.parametrize("name", sorted(set(el.QUIRKY_SHAPES) - TPM2_EVENTLOG_FAILS))
def test_logs_shaped_like_real_firmware_agree_with_tpm2_eventlog(name: str, tmp_path: Path) -> None:
    """Each shape public firmware logs show (tests/support/eventlogs.py: quirky), parsed by us and
    by tpm2_eventlog, an independent parser: same events, banks, replayed PCRs, Secure Boot."""
    data = quirky_logs()[name]
    (tmp_path / "log").write_bytes(data)
    log = eventlog.parse(data)
    count, pcrs, text = _tpm2_eventlog(tmp_path / "log")
    assert len(log.events) == count
    if log.spec is not None:
        listed = [line.split(":")[1].strip() for line in text.splitlines() if "algorithmId:" in line]
        assert list(log.banks) == listed
    replayed = log.replay()
    for bank, values in pcrs.items():
        assert set(replayed[bank]) == {int(i) for i in values}
        for index, value in values.items():  # YAML reads 0x... as an integer
            if int(index) == 0 and log.startup_locality is not None:
                continue  # tpm2_eventlog ignores StartupLocality (see the next test)
            assert int.from_bytes(replayed[bank][int(index)], "big") == value, (bank, index)
    chunks = text.split("PCRIndex:")
    shown = [c for c in chunks if "UnicodeName: SecureBoot" in c and "EV_EFI_VARIABLE_DRIVER_CONFIG" in c]
    parts = shown[-1].split("VariableData:") if shown else []
    data_hex = parts[1].split()[0].strip('"').lower() if len(parts) > 1 else ""
    assert log.secure_boot is (data_hex in ("01", "1") if shown else None)


@pytest.mark.parametrize("name", ["startup-locality-3", "sha1-only-locality"])
def test_startup_locality_starts_pcr0_at_the_locality(name: str) -> None:
    """TCG PFP 10.4.5.3: PCR 0 starts at the StartupLocality (3: 00..03) before the first
    extend. go-eventlog replays so and its expected PCRs for real logs match; tpm2_eventlog
    5.x starts at zero, which a real TPM would not."""
    events = el.boot(cert_der=cert_der())
    bank = "sha256" if name.startswith("startup") else "sha1"
    log = eventlog.parse(quirky_logs()[name])
    assert log.replay()[bank][0] == el.replay(events, bank, locality=3)[0]
    assert log.replay()[bank][0] != el.replay(events, bank)[0]


def test_an_empty_secure_boot_variable_is_off() -> None:
    assert eventlog.parse(quirky_logs()["secure-boot-empty"]).secure_boot is False


def test_no_action_records_may_name_any_pcr() -> None:
    """Some firmware files EV_NO_ACTION records under PCR 0xFFFFFFFF; they are never extended."""
    log = eventlog.parse(quirky_logs()["no-action-pcr-ffffffff"])
    assert any(ev.pcr == 0xFFFFFFFF for ev in log.events)
    assert 0xFFFFFFFF not in log.replay()["sha256"]


def test_events_may_carry_fewer_digests_than_the_spec_id_lists() -> None:
    log = eventlog.parse(quirky_logs()["fewer-digests-than-banks"])
    assert log.replay()["sha384"] == {}
    with pytest.raises(EventLogMismatch):
        eventlog.verify_replay(log, {"sha384": {0: b"\x01" * 48}, "sha256": {}})


def test_old_shim_authority_events_verify_over_their_covered_bytes() -> None:
    log = eventlog.parse(quirky_logs()["old-shim-authority"])
    facts = bootfacts.facts(log.events, bank="sha256")
    assert facts.uninterpreted == ()
    assert [(a.variable, a.subject) for a in facts.authorities][-1] == ("Shim", "CN=Test Secure Boot CA")


def test_unknown_event_types_are_kept() -> None:
    log = eventlog.parse(quirky_logs()["unknown-event-type"])
    assert log.events[-1].type_name == "EV_UNKNOWN_0x800000ff"
    assert 5 in log.replay()["sha256"]


def test_vendor_info_beyond_the_event_is_refused() -> None:
    """A Spec ID event whose vendor info runs past its declared size (tpm2-tools keeps such a file
    among its fixtures and reads past the event): the bytes belong to no event, refused."""
    data = bytearray(el.build([], banks=("sha1",)))
    data[-1] = 4  # vendorInfoSize 4 ...
    data += b"\xde\xad\xbe\xef"  # ... outside the 0x1d-byte event
    with pytest.raises(EventLogInvalid, match="vendor info"):
        eventlog.parse(bytes(data))


# -- synthetic logs: replay and every forgery ------------------------------------------------------


def _quote(
    events: list[el.Ev], bank: str = "sha256", locality: int | None = None
) -> dict[str, dict[int, bytes]]:
    values = el.replay(events, bank, locality=locality)
    return {bank: {i: values.get(i, bytes(32)) for i in range(10)}}


def test_a_built_log_replays_and_shows_its_facts() -> None:
    events = el.boot(cert_der=cert_der())
    log = eventlog.parse(el.build(events))
    eventlog.verify_replay(log, _quote(events))
    assert log.banks == ("sha1", "sha256")
    assert log.secure_boot is True
    facts = bootfacts.facts(log.events, bank="sha256", pcrs=range(10))
    assert [c.text for c in facts.kernel_cmdlines] == ["/vmlinuz-6.8 root=/dev/sda1 ro"]
    assert [c.text for c in facts.grub_commands] == ["linux /vmlinuz-6.8 root=/dev/sda1 ro"]
    assert next(a.path for a in facts.boot_applications) == "\\EFI\\ubuntu\\shimx64.efi"
    assert facts.dbx_digests() == {"aa" * 32, "bb" * 32}
    assert [a.subject for a in facts.authorities] == ["CN=Test Secure Boot CA"]
    assert facts.uninterpreted == ()


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
    facts = bootfacts.facts(log.events, bank="sha256", pcrs=range(10))
    assert facts.secure_boot is None
    assert log.secure_boot is None
    assert [u.event.number for u in facts.uninterpreted if u.event] == [3]


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
    facts = bootfacts.facts(log.events, bank="sha256", pcrs=range(10))
    assert facts.kernel_cmdlines == ()
    assert [(u.event.number, u.reason[:25]) for u in facts.uninterpreted if u.event] == [
        (cmdline + 1, "grub text does not hash t"),  # numbers count the Spec ID event too
        (cmdline, "grub's linux command is n"),  # the command whose command line is gone
    ]


@pytest.mark.parametrize("change", ["tamper", "drop", "reorder", "lie"])
def test_a_changed_log_no_longer_replays_to_the_quote(change: str) -> None:
    events = el.boot()
    quote = _quote(events)
    if change == "tamper":  # other data and its honest digest
        events[15] = el.application(b"\x44" * 32)
    elif change == "drop":
        del events[16]
    elif change == "reorder":  # two events of PCR 4
        events[15], events[16] = events[16], events[15]
    else:  # a digest that is not what the TPM was extended with
        events[1].digests = {"sha256": b"\x00" * 32}
    log = eventlog.parse(el.build(events))
    with pytest.raises(EventLogMismatch) as info:
        eventlog.verify_replay(log, quote)
    assert info.value.code == "event_log_mismatch"


def test_events_in_unquoted_pcrs_are_not_facts() -> None:
    events = el.boot()
    log = eventlog.parse(el.build(events))
    facts = bootfacts.facts(log.events, bank="sha256", pcrs=range(8))
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
    bank = bootfacts.preferred_bank(log.banks)
    if bank:
        bootfacts.facts(log.events, bank=bank)


_SAMPLES = ("agile-three-banks", "sha1-only-locality", "old-shim-authority")  # quirky_logs() names


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, len(_SAMPLES) - 1),
    at=st.integers(0, 40_000),
    flips=st.binary(min_size=1, max_size=4),
    cut=st.integers(0, 8),
)
def test_mutated_real_logs_raise_only_attestation_errors(which: int, at: int, flips: bytes, cut: int) -> None:
    data = bytearray(quirky_logs()[_SAMPLES[which]])
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
    bootfacts.facts(log.events, bank=bank)
    with pytest.raises(AttestationError):
        eventlog.verify_replay(
            log, {bank: {i: b"\x01" * len(log.events[1].digests.get(bank, b"x" * 20)) for i in range(8)}}
        )
