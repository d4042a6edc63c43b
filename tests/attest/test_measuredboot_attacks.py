"""The event log's unsigned parts cannot decide the verdict (issue 21, findings 1 and 2).

Each attack keeps every digest the TPM was extended with (so the log still replays to the signed
quote) and changes only what the TPM does not sign: an event's type, its data, or what root
appends after boot (and extends into the PCR so the quote agrees). Each was accepted before the
interpreter checked types against the TCG PC Client Platform Firmware Profile; each is refused
now with ``measured_boot_violation`` naming the event, while the honest log of the same boot gets
the same verdict it always got.
"""

from __future__ import annotations

import hashlib

import pytest

from attest import eventlog
from attest.errors import MeasuredBootViolation
from attest.measuredboot import facts as bootfacts
from attest.measuredboot import policy as measuredboot
from tests.support import eventlogs as el
from tests.support.certs import ca_der, sha256_of

# Certificates are made when a test first asks (functools.cache), not at import: a refusal by the
# installed cryptography fails those tests, not the collection.


CHAIN = ["11" * 32, "22" * 32]  # el.boot's shim and grub: grub measures the command line
ALLOWED_CMDLINE = "/vmlinuz-6.8 root=/dev/sda1 ro"
EVIL_KERNEL = b"MZ... the forbidden kernel's Authenticode-hashed bytes"


def _policy(**rules: object) -> measuredboot.MeasuredBootPolicy:
    return measuredboot.policy_from_obj({"classes": [{"name": "fleet", **rules}]})


def judge(events: list[el.Ev], policy: measuredboot.MeasuredBootPolicy) -> measuredboot.MeasuredBootResult:
    """What the join service does: replay against the quote (the TPM holds what ``events``
    extended), then the facts of the quoted PCRs and the policy."""
    values = el.replay(events, "sha256")
    quote = {"sha256": {i: values.get(i, bytes(32)) for i in range(10)}}
    log = eventlog.parse(el.build(events))
    eventlog.verify_replay(log, quote)  # every attack below still replays to the signed quote
    return measuredboot.enforce(policy, bootfacts.facts(log.events, bank="sha256", pcrs=range(10)))


def _retyped(ev: el.Ev, new_type: int, data: bytes | None = None) -> el.Ev:
    """The same digests (what the TPM vouches for) under another type and, optionally, data."""
    return el.Ev(
        ev.pcr,
        new_type,
        ev.data if data is None else data,
        digests={b: ev.digest(b) for b in ("sha1", "sha256")},
    )


def _index(events: list[el.Ev], pred: object) -> int:
    return next(i for i, e in enumerate(events) if pred(e))  # type: ignore[operator]


def test_an_authority_retyped_as_an_efi_action_is_refused() -> None:
    """shim verified by an attacker's db key: its EV_EFI_VARIABLE_AUTHORITY event relabelled
    EV_EFI_ACTION keeps data that hashes to the digest, but that data is no action string."""
    policy = _policy(authorities=[sha256_of(ca_der())])
    honest = el.boot(cert_der=ca_der("Attacker db key"))
    with pytest.raises(MeasuredBootViolation, match=r"authority CN=Attacker db key \(db\) is not allowed"):
        judge(honest, policy)
    forged = list(honest)
    at = _index(forged, lambda e: e.type == el.EV_EFI_VARIABLE_AUTHORITY)
    forged[at] = _retyped(forged[at], el.EV_EFI_ACTION)
    with pytest.raises(MeasuredBootViolation) as info:
        judge(forged, policy)
    assert info.value.code == "measured_boot_violation"
    assert f"event {at + 1} (PCR 7, EV_EFI_ACTION): not an action string" in str(info.value)
    assert "(rule authorities)" in str(info.value)
    assert judge(el.boot(cert_der=ca_der()), policy).matched_class == "fleet"


def test_a_forbidden_kernel_retyped_as_a_separator_is_refused() -> None:
    """The kernel's EV_EFI_BOOT_SERVICES_APPLICATION relabelled EV_SEPARATOR with its Authenticode
    preimage as data: the data hashes to the digest, but a separator is 4 bytes."""
    allowed = [
        hashlib.sha256(b"shim").digest(),
        hashlib.sha256(b"grub").digest(),
        hashlib.sha256(b"vmlinuz").digest(),
    ]
    policy = _policy(boot_applications=[d.hex() for d in allowed])
    honest = el.boot(shim=allowed[0])
    grub = _index(
        honest, lambda e: e.type == el.EV_EFI_BOOT_SERVICES_APPLICATION and e.digest("sha256") == b"\x22" * 32
    )
    honest[grub] = el.application(allowed[1], "\\EFI\\ubuntu\\grubx64.efi")
    evil = el.application(hashlib.sha256(EVIL_KERNEL).digest(), "\\vmlinuz-evil")
    evil.digests["sha1"] = hashlib.sha1(EVIL_KERNEL, usedforsecurity=False).digest()
    honest[-1] = evil
    with pytest.raises(
        MeasuredBootViolation, match=r"boot application \w+ \(\\vmlinuz-evil\) is not allowed"
    ):
        judge(honest, policy)
    forged = list(honest)
    forged[-1] = _retyped(evil, el.EV_SEPARATOR, EVIL_KERNEL)
    with pytest.raises(MeasuredBootViolation) as info:
        judge(forged, policy)
    assert info.value.code == "measured_boot_violation"
    assert f"event {len(forged)} (PCR 4, EV_SEPARATOR): separator data is not 00000000" in str(info.value)
    assert "(rule boot_applications)" in str(info.value)
    honest[-1] = el.application(allowed[2], "\\vmlinuz-6.8")
    assert judge(honest, policy).matched_class == "fleet"


def test_a_kernel_command_line_relabelled_as_a_grub_command_is_refused() -> None:
    """grub's prefix is outside the digest: ``kernel_cmdline: X`` rewritten as ``grub_cmd: X``
    hides the real command line, and root extends PCR 8 with an allowed one and appends it."""
    policy = _policy(kernel_cmdlines=[ALLOWED_CMDLINE], kernel_cmdline_chains=[CHAIN])
    honest = el.boot(kernel="/vmlinuz-6.8 init=/bin/sh")
    with pytest.raises(
        MeasuredBootViolation, match=r"kernel command line '/vmlinuz-6\.8 init=/bin/sh' is not"
    ):
        judge(honest, policy)
    forged = list(honest)
    at = _index(forged, lambda e: e.data.startswith(b"kernel_cmdline: "))
    forged[at] = el.grub("grub_cmd", "/vmlinuz-6.8 init=/bin/sh")  # the digest of the text, unchanged
    assert forged[at].digest("sha256") == honest[at].digest("sha256")
    forged.append(el.grub("kernel_cmdline", ALLOWED_CMDLINE))  # root: tpm2_pcrextend 8, then append
    with pytest.raises(MeasuredBootViolation) as info:
        judge(forged, policy)
    text = str(info.value)
    assert info.value.code == "measured_boot_violation"
    assert (
        f"event {at} (PCR 8, EV_IPL): grub's linux command is not followed by the kernel command line" in text
    )
    assert f"event {len(forged)} (PCR 8, EV_IPL): a kernel command line that does not directly follow" in text
    assert "(rule kernel_cmdlines)" in text
    assert judge(el.boot(), policy).matched_class == "fleet"


def test_secure_boot_appended_after_boot_is_refused() -> None:
    """Secure Boot off; root extends PCR 7 with a SecureBoot=1 variable after boot and appends
    the event: the last variable no longer wins, configuration counts only before the separator."""
    policy = measuredboot.policy_from_obj({"secure_boot": "required"})
    honest = el.boot(secure=False)
    with pytest.raises(MeasuredBootViolation, match="Secure Boot is off"):
        judge(honest, policy)
    forged = [*honest, el.secure_boot(True)]
    with pytest.raises(MeasuredBootViolation) as info:
        judge(forged, policy)
    text = str(info.value)
    assert info.value.code == "measured_boot_violation"
    assert "event 3 (PCR 7, EV_EFI_VARIABLE_DRIVER_CONFIG): Secure Boot is off" in text
    assert (
        f"event {len(forged)} (PCR 7, EV_EFI_VARIABLE_DRIVER_CONFIG): variable SecureBoot after PCR 7's"
        in text
    )
    assert judge(el.boot(), policy).ok


def test_a_full_dbx_appended_after_boot_is_refused() -> None:
    required = [bytes([i]) * 32 for i in (0xAA, 0xCC, 0xDD)]
    policy = _policy(dbx_required=[d.hex() for d in required])
    honest = el.boot()  # its dbx holds aa.. and bb..
    with pytest.raises(MeasuredBootViolation, match="dbx lacks 2 required entries"):
        judge(honest, policy)
    forged = [*honest, el.dbx(*required)]
    with pytest.raises(MeasuredBootViolation) as info:
        judge(forged, policy)
    assert info.value.code == "measured_boot_violation"
    assert f"event {len(forged)} (PCR 7, EV_EFI_VARIABLE_DRIVER_CONFIG): variable dbx after PCR 7's" in str(
        info.value
    )
    full = el.boot()
    full[3] = el.dbx(*required)
    assert judge(full, policy).matched_class == "fleet"


def test_a_second_variable_before_the_separator_is_refused() -> None:
    """Once each: a firmware profile never measures SecureBoot twice, so two are not "the last"."""
    policy = measuredboot.policy_from_obj({"secure_boot": "required"})
    events = el.boot(secure=False)
    events.insert(3, el.secure_boot(True))
    with pytest.raises(MeasuredBootViolation, match="a second SecureBoot variable in PCR 7"):
        judge(events, policy)


def test_pcr7_without_a_separator_shows_no_configuration() -> None:
    policy = measuredboot.policy_from_obj({"secure_boot": "required"})
    events = [e for e in el.boot() if not (e.type == el.EV_SEPARATOR and e.pcr == 7)]
    with pytest.raises(MeasuredBootViolation, match="PCR 7 has no separator"):
        judge(events, policy)


def test_uefi_debug_mode_fails_secure_boot() -> None:
    events = el.boot()
    events.insert(4, el.Ev(7, el.EV_EFI_ACTION, b"UEFI Debug Mode"))
    with pytest.raises(MeasuredBootViolation, match="UEFI debug mode"):
        judge(events, measuredboot.policy_from_obj({"secure_boot": "required"}))


@pytest.mark.parametrize(
    ("rules", "pcrs", "reason"),
    [
        ({"boot_applications": ["11" * 32]}, range(4), "boot_applications needs PCR 4"),
        ({"authorities": ["sha256:" + "ab" * 32]}, range(7), "authorities needs PCR 7"),
        ({"dbx_required": ["11" * 32]}, range(7), "dbx_required needs PCR 7"),
        ({"secure_boot": "required"}, (0, 1, 2, 3, 4), "secure_boot needs PCR 7"),
        (
            {"kernel_cmdlines": ["x"], "kernel_cmdline_chains": [CHAIN]},
            range(8),
            "kernel_cmdlines needs PCR 8",
        ),
        (
            {"kernel_cmdlines": ["x"], "kernel_cmdline_chains": [CHAIN]},
            (5, 6, 7, 8),
            "kernel_cmdlines needs PCR 4",
        ),
    ],
)
def test_a_rule_whose_pcrs_are_not_quoted_is_a_config_error(
    rules: dict[str, object], pcrs: range, reason: str
) -> None:
    policy = _policy(**rules)
    assert reason in (policy.missing_pcrs(pcrs) or "")
    assert policy.missing_pcrs(range(10)) is None
