"""H-CRTM platforms (issue 23): a hardware CRTM measures itself at locality 4 before the firmware
runs, so PCR 0 starts at 00..04 and its first extend is the EV_EFI_HCRTM_EVENT's digest (TCG PC
Client Platform Firmware Profile; TPM 2.0 Part 1 section 34.3). The replay follows that in every
bank, SM3-256 included; before, such a log replayed PCR 0 from zero and was refused
``event_log_mismatch``. The real log is in test_reallogs.py (tpm2-tss's H-CRTM sample)."""

from __future__ import annotations

import pytest

from attest import eventlog
from attest.errors import EventLogInvalid, EventLogMismatch
from tests.support import eventlogs as el

BANKS = ("sha1", "sha256", "sm3_256")


def _quote(events: list[el.Ev], locality: int | None) -> dict[str, dict[int, bytes]]:
    return {b: dict(el.replay(events, b, locality=locality)) for b in BANKS}


@pytest.mark.parametrize("logged_locality", [None, 4])
def test_an_hcrtm_log_replays_from_locality_4_in_every_bank(logged_locality: int | None) -> None:
    """With or without a StartupLocality record (the real H-CRTM log has none): the TPM's PCR 0
    started at 4."""
    events = [el.hcrtm(), *el.boot()]
    log = eventlog.parse(el.build(events, banks=BANKS, locality=logged_locality))
    assert log.hcrtm
    assert log.pcr0_locality == 4
    assert log.banks == BANKS
    quote = _quote(events, locality=4)
    eventlog.verify_replay(log, quote)
    for bank in BANKS:
        assert log.replay()[bank][0] == quote[bank][0]
        assert log.replay()[bank][0] != el.replay(events, bank)[0]  # what a replay from zero gives


def test_without_the_hcrtm_rule_the_same_log_would_mismatch() -> None:
    events = [el.hcrtm(), *el.boot()]
    log = eventlog.parse(el.build(events, banks=BANKS))
    with pytest.raises(EventLogMismatch, match="sha1:0"):
        eventlog.verify_replay(log, _quote(events, locality=None))


@pytest.mark.parametrize(
    ("events", "locality", "reason"),
    [
        ([*el.boot()[:1], el.hcrtm(), *el.boot()[1:]], None, "must be the first event of PCR 0"),
        ([el.hcrtm(), el.hcrtm(), *el.boot()], None, "must be the first event of PCR 0"),
        ([el.Ev(0, el.EV_EFI_HCRTM_EVENT, b"HCRTM!"), *el.boot()], None, "must be b'HCRTM'"),
        ([el.Ev(4, el.EV_EFI_HCRTM_EVENT, b"HCRTM"), *el.boot()], None, "must be the first event of PCR 0"),
        ([el.hcrtm(), *el.boot()], 3, "StartupLocality 3"),
    ],
)
def test_a_malformed_hcrtm_log_is_invalid(events: list[el.Ev], locality: int | None, reason: str) -> None:
    with pytest.raises(EventLogInvalid, match=reason) as info:
        eventlog.parse(el.build(events, banks=BANKS, locality=locality))
    assert info.value.code == "event_log_invalid"
