"""attest.measuredboot: the measured-boot policy judges proven facts, names the event and the rule."""

from __future__ import annotations

import functools

import pytest
from cryptography.hazmat.primitives import serialization

from attest import eventlog
from attest.errors import MeasuredBootViolation
from attest.measuredboot import facts as bootfacts
from attest.measuredboot import policy as measuredboot
from tests.support import eventlogs as el
from tests.support.certs import ca_der, self_signed, sha256_of

SHIM = b"\x11" * 32
CHAIN = [SHIM.hex(), "22" * 32]  # shim, then grub: the loader that measures the command line


def _facts(events: list[el.Ev], pcrs: range = range(10)) -> bootfacts.BootFacts:
    log = eventlog.parse(el.build(events))
    return bootfacts.facts(log.events, bank="sha256", pcrs=pcrs)


def _policy(**cls: object) -> measuredboot.MeasuredBootPolicy:
    return measuredboot.policy_from_obj({"classes": [{"name": "gpu", **cls}]})


@functools.cache
def good_policy() -> measuredboot.MeasuredBootPolicy:
    return _policy(
        secure_boot="required",
        authorities=[sha256_of(ca_der())],
        dbx_required=["aa" * 32],
        boot_applications=[SHIM.hex(), "22" * 32, "33" * 32],
        kernel_cmdlines=["/vmlinuz-6.8 root=/dev/sda1 ro"],
        kernel_cmdline_chains=[CHAIN],
    )


def test_a_good_boot_matches_its_class() -> None:
    result = measuredboot.enforce(good_policy(), _facts(el.boot(cert_der=ca_der())))
    assert (result.ok, result.matched_class) == (True, "gpu")


def test_secure_boot_off_is_refused_with_the_event_named() -> None:
    with pytest.raises(
        MeasuredBootViolation,
        match=r"event 3 \(PCR 7, EV_EFI_VARIABLE_DRIVER_CONFIG\): Secure "
        r"Boot is off \(rule secure_boot\)",
    ) as info:
        measuredboot.enforce(good_policy(), _facts(el.boot(secure=False, cert_der=ca_der())))
    assert info.value.code == "measured_boot_violation"


def test_an_unknown_kernel_is_refused_with_the_event_named() -> None:
    events = el.boot(cert_der=ca_der())
    events[-1] = el.application(b"\x44" * 32, "\\vmlinuz-evil")
    facts = _facts(events)
    with pytest.raises(
        MeasuredBootViolation,
        match=r"PCR 4, EV_EFI_BOOT_SERVICES_APPLICATION\): boot application "
        r"4444.*is not allowed \(rule boot_applications\)",
    ):
        measuredboot.enforce(good_policy(), facts)


def test_an_unknown_authority_and_command_line_are_refused() -> None:
    _, other = self_signed("Somebody Else")
    facts = _facts(el.boot(cert_der=other.public_bytes(serialization.Encoding.DER), kernel="init=/bin/sh"))
    result = measuredboot.evaluate(good_policy(), facts)
    assert not result.ok
    assert {f.rule for f in result.violations} == {"authorities", "kernel_cmdlines"}
    assert "authority CN=Somebody Else (db) is not allowed" in result.reason


def test_a_missing_dbx_entry_is_refused() -> None:
    result = measuredboot.evaluate(_policy(dbx_required=["cc" * 32]), _facts(el.boot()))
    assert [f.rule for f in result.violations] == ["dbx_required"]


def test_kernel_command_line_rules_need_pcr8_in_the_quote() -> None:
    result = measuredboot.evaluate(
        _policy(kernel_cmdlines=["/vmlinuz-6.8 root=/dev/sda1 ro"], kernel_cmdline_chains=[CHAIN]),
        _facts(el.boot(), pcrs=range(8)),
    )
    assert not result.ok
    assert "no kernel command line in PCR 8" in result.reason


def test_unproven_secure_boot_is_not_on() -> None:
    events = el.boot(secure=False)
    forged = el.secure_boot(True)
    forged.digests = {b: events[2].digest(b) for b in ("sha1", "sha256")}
    events[2] = forged
    result = measuredboot.evaluate(measuredboot.policy_from_obj({"secure_boot": "required"}), _facts(events))
    assert not result.ok
    assert "does not hash to its digest" in result.reason


def test_warn_classes_report_and_admit() -> None:
    policy = measuredboot.policy_from_obj(
        {"classes": [{"name": "w", "mode": "warn", "secure_boot": "required"}]}
    )
    result = measuredboot.enforce(policy, _facts(el.boot(secure=False)))
    assert result.ok
    assert [f.rule for f in result.warnings] == ["secure_boot"]


def test_the_top_level_secure_boot_applies_without_classes() -> None:
    policy = measuredboot.policy_from_obj({"secure_boot": "required"})
    assert measuredboot.evaluate(policy, _facts(el.boot())).ok
    assert not measuredboot.evaluate(policy, _facts(el.boot(secure=False))).ok
    assert measuredboot.evaluate(measuredboot.policy_from_obj({}), _facts(el.boot(secure=False))).ok


@pytest.mark.parametrize(
    ("doc", "reason"),
    [
        ({"classes": [{"name": "x"}]}, "has no rule"),
        ({"classes": [{"name": "x", "boot_applications": ["zz"]}]}, "not a SHA-256"),
        ({"classes": [{"name": "x", "secure_boot": "required"}] * 2}, "unique"),
        ({"secure_boot": "maybe"}, "secure_boot"),
        ({"extra": 1}, "extra"),
    ],
)
def test_bad_policies_are_refused_at_load(doc: object, reason: str) -> None:
    with pytest.raises(measuredboot.MeasuredBootPolicyError, match=reason):
        measuredboot.policy_from_obj(doc)


@pytest.mark.parametrize("name", ["agile-three-banks", "old-shim-authority", "startup-locality-3"])
def test_a_class_learned_from_a_log_admits_it_and_refuses_secure_boot_off(name: str) -> None:
    logs = el.quirky(ca_der())
    log = eventlog.parse(logs[name])
    facts = bootfacts.facts(log.events, bank="sha256", pcrs=range(10))
    learned = measuredboot.learn([facts], name="fleet", cmdlines=True)
    assert learned.secure_boot == "required"
    policy = measuredboot.MeasuredBootPolicy(classes=(learned,))
    assert measuredboot.enforce(policy, facts).matched_class == "fleet"
    off = bootfacts.facts(eventlog.parse(logs["secure-boot-off"]).events, bank="sha256", pcrs=range(10))
    with pytest.raises(MeasuredBootViolation, match="rule secure_boot"):
        measuredboot.enforce(policy, off)


@pytest.mark.parametrize(
    ("rule", "index"),
    [("authorities", 15), ("boot_applications", 16), ("kernel_cmdlines", 19)],
)
def test_a_retyped_event_cannot_hide_from_a_rule(rule: str, index: int) -> None:
    """The event type is not signed: a forger who turns the unknown CA's authority event, the
    kernel's application event or the command line into an uninterpreted type keeps the digests
    (the replay still matches) but must not escape the rule about that PCR."""
    _, other = self_signed("Unknown CA")
    events = el.boot(cert_der=other.public_bytes(serialization.Encoding.DER), kernel="init=/bin/sh")
    assert events[index].type in (
        el.EV_EFI_VARIABLE_AUTHORITY,
        el.EV_EFI_BOOT_SERVICES_APPLICATION,
        el.EV_IPL,
    )
    real = events[index]
    events[index] = el.Ev(
        real.pcr, 0x800000FF, b"harmless", digests={b: real.digest(b) for b in ("sha1", "sha256")}
    )
    rules = {rule: good_policy().classes[0].model_dump()[rule]}
    if rule == "kernel_cmdlines":
        rules["kernel_cmdline_chains"] = [CHAIN]
    policy = _policy(**rules)
    result = measuredboot.evaluate(policy, _facts(events))
    assert not result.ok
    assert f"(PCR {real.pcr}, EV_UNKNOWN_0x800000ff): an event type the firmware profile" in result.reason
    assert f"(rule {rule})" in result.reason
