"""Boot records (issue 43) on the real firmware logs of the public test data: the record holds the
facts the verdict read and nothing else; judged again by any policy it gives the verdict the
join gives the log (hypothesis edits the classes); nothing the node sends outside the quote (an
unquoted PCR's events, a tail, data outside an event's digest) reaches it; it stays small."""

from __future__ import annotations

import re
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attest import eventlog
from attest.bootrecord import judge as whatif
from attest.bootrecord.build import Built, record_facts
from attest.bootrecord.fleet import group_key, metric_groups
from attest.bootrecord.model import BootRecord
from attest.bootrecord.recorded import facts_of
from attest.errors import AttestationError
from attest.measuredboot import facts as bootfacts
from attest.measuredboot import policy as measuredboot
from attest.measuredboot.model import MeasuredBootClass, MeasuredBootPolicy
from attest.pcr import PcrPolicy
from bootstrap.service.join.evidence import judge_event_log
from tests.support import eventlogs as el
from tests.support.bootrecords import built_from, quoted_of
from tests.support.shared_data import shared

DATA = shared("eventlogs")
DATA.require()
NOT_A_BOOT = {"go-attestation-short-no-action.bin"}
BOOTS = sorted(set(DATA.names()) - NOT_A_BOOT)
QUOTED_PCRS = range(10)  # 0-9: PCRs 4, 7 and 8 are read, so every rule can be judged
MAX_RECORD_JSON = 8 * 1024
_PATH = re.compile(r" \([^()]*\) is not allowed")


@cache
def _raw(name: str) -> bytes:
    return DATA.read(name)


@cache
def _bank(name: str) -> str:
    bank = bootfacts.preferred_bank(eventlog.parse(_raw(name)).banks)
    assert bank is not None
    return bank


@cache
def _quoted(name: str) -> dict[str, dict[int, bytes]]:
    return quoted_of(_raw(name), _bank(name), QUOTED_PCRS)


@cache
def _facts(name: str) -> bootfacts.BootFacts:
    facts = record_facts(eventlog.parse(_raw(name)), _quoted(name))
    assert facts is not None
    return facts


@cache
def _learned(name: str) -> MeasuredBootClass:
    facts = _facts(name)
    if facts.bank == "sha256":
        return measuredboot.learn([facts], name="learned", cmdlines=True)
    # A SHA-1-only log: boot applications are listed by Authenticode SHA-256, which it lacks.
    return MeasuredBootClass(
        name="learned",
        secure_boot="required" if facts.secure_boot else "optional",
        authorities=tuple(f"sha256:{a.sha256}" for a in facts.authorities),
        dbx_required=tuple(sorted(facts.dbx_digests())) or None,
        efi_actions=tuple(dict.fromkeys(a.text for a in facts.vendor_actions)),
    )


def _built(name: str, policy: MeasuredBootPolicy | None = None) -> Built:
    return built_from(_raw(name), _quoted(name), policy)


def _join(policy: MeasuredBootPolicy, name: str) -> tuple[str, str | None, str]:
    """What a join decides on this log: (outcome, class, the refusal's detail)."""
    try:
        matched = judge_event_log(policy, _raw(name), _quoted(name), "node")
    except AttestationError as exc:
        return "refuse", None, exc.detail
    return "pass", matched, ""


def _shape(result: measuredboot.MeasuredBootResult) -> tuple[object, ...]:
    """A verdict as a what-if can reproduce it: the device path a boot application's message
    shows is not vouched for, so it is not kept (and not compared)."""
    return (
        result.ok,
        result.matched_class,
        tuple(
            (f.rule, f.where, f.pcr_class, _PATH.sub(" is not allowed", f.detail)) for f in result.violations
        ),
        tuple(
            (f.rule, f.where, f.pcr_class, _PATH.sub(" is not allowed", f.detail)) for f in result.warnings
        ),
    )


def _policies(name: str) -> list[MeasuredBootPolicy]:
    """The learned class, and each way of tightening it a rollout might try."""
    learned = _learned(name)
    facts = _facts(name)
    out = [
        MeasuredBootPolicy(classes=(learned,)),
        MeasuredBootPolicy(secure_boot="required"),
        MeasuredBootPolicy(secure_boot="required", classes=(replace_class(learned, mode="warn"),)),
        MeasuredBootPolicy(classes=(replace_class(learned, dbx_required=("ab" * 32,)),)),
        MeasuredBootPolicy(classes=(replace_class(learned, efi_actions=()),)),
    ]
    if learned.boot_applications:
        out.append(
            MeasuredBootPolicy(
                classes=(replace_class(learned, boot_applications=learned.boot_applications[1:]),)
            )
        )
    if learned.authorities:
        out.append(
            MeasuredBootPolicy(classes=(replace_class(learned, authorities=learned.authorities[:-1]),))
        )
    if learned.kernel_cmdlines:
        out.append(MeasuredBootPolicy(classes=(replace_class(learned, kernel_cmdlines=("quiet",)),)))
    if facts.bank == "sha256" and facts.boot_applications:
        chain = (facts.boot_applications[-1].digest,)
        out.append(
            MeasuredBootPolicy(
                classes=(replace_class(learned, kernel_cmdlines=("x",), kernel_cmdline_chains=(chain,)),)
            )
        )
    return out


def replace_class(c: MeasuredBootClass, **changes: object) -> MeasuredBootClass:
    return MeasuredBootClass.model_validate({**c.model_dump(), **changes})


# -- the record is the verdict's facts ------------------------------------------------------------


@pytest.mark.parametrize("name", BOOTS)
def test_the_record_holds_the_facts_the_verdict_read(name: str) -> None:
    policy = MeasuredBootPolicy(classes=(_learned(name),))
    built = _built(name, policy)
    rec = built.record
    facts = _facts(name)
    mb = rec.measured_boot
    assert mb is not None
    assert mb.truncated == ()  # no real log comes near a cap
    assert mb.bank == facts.bank
    assert mb.secure_boot is facts.secure_boot
    assert [(a.sha256, a.variable, a.event[0]) for a in mb.authorities] == [
        (a.sha256, a.variable, a.event.number) for a in facts.authorities
    ]
    assert mb.chain == tuple(a.digest for a in facts.boot_applications)
    assert [c.text for c in mb.cmdlines] == [c.text for c in facts.kernel_cmdlines]
    assert [u.event for u in mb.uninterpreted] == []
    dbx = facts.keys.get("dbx")
    if dbx is None:
        assert mb.dbx is None
    else:
        assert mb.dbx is not None
        assert mb.dbx.entries == len(dbx.sha256_entries)
        assert built.dbx[mb.dbx.sha256] == b"".join(sorted(dbx.sha256_entries))
    assert rec.pcrs == {facts.bank: {i: v.hex() for i, v in _quoted(name)[facts.bank].items()}}
    assert mb.matched_class == "learned"
    learned = _learned(name)
    proven = facts.kernel_cmdlines[-1].text if learned.kernel_cmdlines else None
    assert mb.kernel_cmdline == proven
    assert BootRecord.model_validate_json(rec.to_json()) == rec
    assert len(rec.to_json()) <= MAX_RECORD_JSON


@pytest.mark.parametrize("name", BOOTS)
def test_judged_again_the_record_gives_the_joins_verdict(name: str) -> None:
    """Every (policy, real log) pair: the policy's evaluation of the record's facts equals its
    evaluation of the log's; the what-if's verdict equals the join's (outcome, class, detail)."""
    built = _built(name)
    dbx = next(iter(built.dbx.values()), None)
    mb = built.record.measured_boot
    assert mb is not None
    for policy in _policies(name):
        if policy.bank_problem(_bank(name)):
            continue  # refused when the config loads
        assert _shape(measuredboot.evaluate(policy, facts_of(mb, dbx))) == _shape(
            measuredboot.evaluate(policy, _facts(name))
        )
        verdict = whatif.judge(
            built.record, PcrPolicy(bank=_bank(name), pcrs=tuple(QUOTED_PCRS)), policy, dbx
        )
        outcome, matched, detail = _join(policy, name)
        assert (verdict.outcome, verdict.measured_boot_class) == (outcome, matched)
        assert _PATH.sub(" is not allowed", verdict.reason) == _PATH.sub(" is not allowed", detail)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    name=st.sampled_from(
        [
            "gce-ubuntu-2404-amd-sev-snp.bin",
            "gdc-host.bin",
            "arch-linux-workstation.bin",
            "gce-rhel8-uefi.bin",
            "go-attestation-sb-cert.bin",
        ]
    ),
)
def test_for_arbitrary_class_edits_the_whatif_verdict_is_the_joins(data: st.DataObject, name: str) -> None:
    learned = _learned(name)
    facts = _facts(name)
    extra = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
    dbx_seen = sorted(facts.dbx_digests())

    def subset(items: tuple[str, ...] | None) -> st.SearchStrategy[tuple[str, ...] | None]:
        base = list(items or ())
        return st.one_of(
            st.none(),
            st.lists(st.sampled_from(base), unique=True).map(tuple) if base else st.just(()),
            st.tuples(*(st.just(x) for x in base)).flatmap(
                lambda t: st.lists(extra, max_size=2).map(lambda e: (*t, *e))
            ),
        )

    classes = []
    for i in range(data.draw(st.integers(1, 3))):
        changes: dict[str, object] = {
            "name": f"c{i}",
            "mode": data.draw(st.sampled_from(["enforce", "warn"])),
            "secure_boot": data.draw(st.sampled_from([None, "required", "optional"])),
            "authorities": data.draw(subset(learned.authorities)),
            "boot_applications": data.draw(subset(learned.boot_applications)),
            "dbx_required": data.draw(
                st.one_of(
                    st.none(),
                    st.lists(st.sampled_from(dbx_seen or ["ab" * 32]), max_size=3, unique=True).map(tuple),
                    st.lists(extra, min_size=1, max_size=2).map(tuple),
                )
            ),
            "efi_actions": data.draw(
                st.lists(st.sampled_from(list(learned.efi_actions) or ["x"]), unique=True).map(tuple)
            ),
        }
        if learned.kernel_cmdlines and data.draw(st.booleans()):
            changes["kernel_cmdlines"] = data.draw(
                subset(learned.kernel_cmdlines).filter(lambda v: v is not None)
            )
            changes["kernel_cmdline_chains"] = learned.kernel_cmdline_chains
        else:
            changes["kernel_cmdlines"] = changes["kernel_cmdline_chains"] = None
        if all(
            changes[r] is None
            for r in ("secure_boot", "authorities", "dbx_required", "boot_applications", "kernel_cmdlines")
        ):
            changes["secure_boot"] = "required"
        classes.append(replace_class(learned, **changes))
    policy = MeasuredBootPolicy(
        secure_boot=data.draw(st.sampled_from(["required", "optional"])), classes=tuple(classes)
    )
    built = _built(name)
    dbx = next(iter(built.dbx.values()), None)
    verdict = whatif.judge(built.record, PcrPolicy(bank=_bank(name), pcrs=tuple(QUOTED_PCRS)), policy, dbx)
    outcome, matched, detail = _join(policy, name)
    assert (verdict.outcome, verdict.measured_boot_class) == (outcome, matched)
    assert _PATH.sub(" is not allowed", verdict.reason) == _PATH.sub(" is not allowed", detail)


# -- nothing outside the quote reaches the record -------------------------------------------------


def _facts_only(rec: BootRecord) -> dict[str, object]:
    """The record without event numbers (a number is the position in the log as sent)."""

    def strip(value: object) -> object:
        if isinstance(value, dict):
            return {
                k: strip(v) for k, v in value.items() if k not in ("event", "secureBootEvent", "debugMode")
            }
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    out = strip(rec.to_obj())
    assert isinstance(out, dict)
    return out


def test_events_in_an_unquoted_pcr_or_a_tail_never_reach_the_record() -> None:
    """A node root can append to the log anything it likes in PCRs the quote does not cover (and
    can extend them, so the replay of the quoted PCRs still holds): a boot application, a command
    line, an authority, Secure Boot off. The record is the same as without them."""
    events = el.boot(cert_der=b"")
    raw = el.build(events)
    quoted = quoted_of(raw, "sha256", range(8))  # PCR 8 is not quoted here
    clean = built_from(raw, quoted).record
    forged = [
        el.application(b"\x66" * 32, "\\EFI\\evil.efi"),
        el.grub("grub_cmd", "linux /evil root=/dev/evil"),
        el.grub("kernel_cmdline", "/evil root=/dev/evil"),
    ]
    for ev in forged[:1]:
        ev.pcr = 14
    tail = el.build([*events, *forged])
    assert built_from(tail, quoted).record == clean  # appended: numbers unchanged, nothing reaches it
    inserted = el.build([*forged, *events])
    assert _facts_only(built_from(inserted, quoted).record) == _facts_only(clean)
    assert eventlog.parse(inserted).events[1].pcr == 14


def test_data_outside_an_events_digest_never_reaches_the_record() -> None:
    """A boot application's device path is in the event's data, outside its digest (the image's
    Authenticode hash): a node can log any path. The record names the application by digest."""
    events = el.boot()
    raw = el.build(events)
    quoted = quoted_of(raw, "sha256", range(9))
    renamed = list(events)
    renamed[15] = el.application(b"\x11" * 32, "\\EFI\\Microsoft\\Boot\\bootmgfw.efi")
    other = el.build(renamed)
    assert other != raw
    assert built_from(other, quoted).record == built_from(raw, quoted).record
    assert "bootmgfw" not in built_from(other, quoted).record.to_json()


def test_a_relabelled_event_in_a_quoted_pcr_is_kept_as_uninterpreted_not_as_a_fact() -> None:
    """An event in a quoted PCR whose type or data the profile does not define there (root cannot
    forge its digest, only its label): the record keeps it as an uninterpreted event of its PCR,
    which fails every rule on that PCR, never as the fact the label claims."""
    events = el.boot()
    events.append(el.Ev(4, el.EV_EFI_VARIABLE_DRIVER_CONFIG, b"not a variable"))
    raw = el.build(events)
    rec = built_from(raw, quoted_of(raw, "sha256", range(9))).record
    assert rec.measured_boot is not None
    assert [(u.pcr, u.event) for u in rec.measured_boot.uninterpreted] == [
        (4, (len(events), 4, el.EV_EFI_VARIABLE_DRIVER_CONFIG))
    ]
    assert len(rec.measured_boot.boot_applications) == 3


# -- bounded, and the groups a fleet view shows ----------------------------------------------------


def test_a_hostile_log_fills_the_record_only_up_to_its_caps() -> None:
    """Thousands of boot applications and actions in a quoted PCR: the record keeps the first
    of each up to its cap and says what it cut; a what-if then declines to judge it."""
    events = [*el.boot(), *(el.application(i.to_bytes(32, "big")) for i in range(500))]
    events += [el.Ev(4, el.EV_EFI_ACTION, f"vendor {i}".encode()) for i in range(200)]
    raw = el.build(events)
    quoted = quoted_of(raw, "sha256", range(9))
    rec = built_from(raw, quoted).record
    mb = rec.measured_boot
    assert mb is not None
    assert len(mb.boot_applications) == 64
    assert len(mb.actions) == 64
    assert set(mb.truncated) == {"bootApplications", "actions"}
    assert len(rec.to_json()) < 16 * 1024
    verdict = whatif.judge(rec, PcrPolicy(pcrs=tuple(range(9))), MeasuredBootPolicy(secure_boot="required"))
    assert verdict.outcome == "unknown"
    assert "bootApplications" in verdict.reason


def test_records_of_the_same_boot_group_together_and_differ_where_the_boot_does() -> None:
    a = built_from(_raw("gce-ubuntu-2404-amd-sev-snp.bin"), _quoted("gce-ubuntu-2404-amd-sev-snp.bin")).record
    b = a.model_copy(update={"boot_id": "0d4c2b1a-9e8f-4a7b-8c6d-5e4f3a2b1c0d"})
    c = built_from(_raw("gdc-host.bin"), _quoted("gdc-host.bin")).record
    assert group_key(a) == group_key(b) != group_key(c)
    assert group_key(a).dbx.endswith("/371")


def test_the_metrics_keep_their_series_bounded_whatever_the_fleet_boots() -> None:
    """10,000 nodes, each with its own boot chain: at most 64 chain/dbx series, the rest counted
    per class pair as other, and no node lost."""
    base = built_from(_raw("gdc-host.bin"), _quoted("gdc-host.bin")).record
    assert base.measured_boot is not None
    records = []
    for i in range(10_000):
        apps = (base.measured_boot.boot_applications[0].model_copy(update={"digest": f"{i:064x}"}),)
        mb = base.measured_boot.model_copy(update={"boot_applications": apps, "matched_class": f"c{i % 3}"})
        records.append(base.model_copy(update={"measured_boot": mb}))
    groups = metric_groups(records)
    assert len({k for k in groups if k[2] != "other"}) == 63
    assert sum(groups.values()) == 10_000
    assert {k for k in groups if k[2] == "other"} == {("none", f"c{i}", "other", "other") for i in range(3)}
