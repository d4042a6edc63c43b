"""Issue 33 findings 2, 6, 8 and 10: measured boot after the third adversarial review.

2. A kernel command line counts only when the boot provably measured it: PCR 4 begins with a
   chain ending in a loader that measures every line into PCR 8, the firmware started nothing
   after it, and grub started no image by a command that measures no line. Root appending grub's
   ``linux`` command and an allowed line to a boot that measured none is refused.
6. Authorities are matched by certificate digest: a certificate with the allowed CA's subject and
   another key is refused, a subject-name entry is refused at load, ``learn`` writes digests.
8. A measured-boot policy with a bank no rule is defined over (SM3-256), or with SHA-256 rules on
   another bank, is refused at load; a join quoted in such a bank gets 403 naming it.
10. Vendor EV_EFI_ACTION strings (HP's "Security Level is Downgraded to 0") pass where a class
   names them and their digest is the string's; "DMA Protection Disabled" (the profile's) is read
   with or without its NUL; UEFI debug mode stays refused and ``learn`` says so in one line.

Every test here fails on the code before issue 33 (see the report); each attack is refused with
``measured_boot_violation``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from attest import eventlog
from attest.errors import MeasuredBootViolation
from attest.measuredboot import facts as bootfacts
from attest.measuredboot import policy as measuredboot
from bootstrap import cli
from bootstrap.config import Settings
from bootstrap.problems import attestation_status
from bootstrap.service.join.evidence import judge_event_log
from tests.attest import test_measuredboot_properties as properties
from tests.support import eventlogs as el
from tests.support.certs import ca_der, sha256_of

# Certificates are made when a test first asks (functools.cache), not at import: a refusal by the
# installed cryptography fails those tests, not the collection.


SHIM, GRUB, KERNEL = b"\x11" * 32, b"\x22" * 32, b"\x33" * 32
ALLOWED = "/vmlinuz-6.8 root=/dev/sda1 ro"
EVIL = "/vmlinuz-6.8 init=/bin/sh lockdown=none"
CHAIN = [SHIM.hex(), GRUB.hex()]
SECURITY_LEVEL_0 = b"Security Level is Downgraded to 0"


def _quote(events: list[el.Ev], bank: str = "sha256") -> dict[str, dict[int, bytes]]:
    values = el.replay(events, bank)
    size = el.ALGS[bank][1]
    return {bank: {i: values.get(i, bytes(size)) for i in range(10)}}


def judge(events: list[el.Ev], policy: measuredboot.MeasuredBootPolicy) -> str | None:
    """The join service's own path: replay against the quote, facts, policy (raises on refusal)."""
    return judge_event_log(policy, el.build(events), _quote(events), "node-a")


def _policy(**rules: Any) -> measuredboot.MeasuredBootPolicy:
    return measuredboot.policy_from_obj({"classes": [{"name": "fleet", **rules}]})


def _root_extends(ev: el.Ev) -> el.Ev:
    """What root does after boot: extend the PCR with the digests and append the event."""
    return el.Ev(ev.pcr, ev.type, ev.data, digests={b: ev.digest(b) for b in ("sha1", "sha256")})


# -- finding 2: a command line root appends counts when the boot measured none -----------------------


def shim_to_kernel(load_options: str = EVIL) -> list[el.Ev]:
    """shim starts the fleet's (allowed, signed) kernel directly with load options: shim measures
    the kernel into PCR 4 and no line into PCR 8."""
    head = el.boot(cert_der=ca_der())[:15]
    return [
        *head,
        el.authority(ca_der()),
        el.application(SHIM, "\\EFI\\ubuntu\\shimx64.efi"),
        el.application(KERNEL, "\\vmlinuz-6.8"),
        el.Ev(12, el.EV_IPL, (load_options + "\x00").encode("utf-16-le")),  # not read by any rule
    ]


def cmdline_policy() -> measuredboot.MeasuredBootPolicy:
    return _policy(
        boot_applications=[SHIM.hex(), GRUB.hex(), KERNEL.hex()],
        kernel_cmdlines=[ALLOWED],
        kernel_cmdline_chains=[CHAIN],
    )


def test_root_appending_a_grub_line_to_a_boot_that_measured_none_is_refused() -> None:
    """The issue's proof of concept: shim -> allowed kernel with ``init=/bin/sh lockdown=none``,
    then root appends ``grub_cmd: linux`` + ``kernel_cmdline:`` with the allowed line (and, for
    good measure, grub's application event into PCR 4)."""
    honest = shim_to_kernel()
    with pytest.raises(MeasuredBootViolation, match="no kernel command line in PCR 8"):
        judge(honest, cmdline_policy())
    forged = [
        *honest,
        _root_extends(el.grub("grub_cmd", f"linux {ALLOWED}")),
        _root_extends(el.grub("kernel_cmdline", ALLOWED)),
    ]
    with pytest.raises(MeasuredBootViolation) as info:
        judge(forged, cmdline_policy())
    assert info.value.code == "measured_boot_violation"
    text = str(info.value)
    assert "do not begin with a chain in kernel_cmdline_chains" in text
    assert "(rule kernel_cmdlines)" in text
    forged.append(_root_extends(el.application(GRUB, "\\EFI\\ubuntu\\grubx64.efi")))
    with pytest.raises(MeasuredBootViolation, match="do not begin with a chain"):
        judge(forged, cmdline_policy())
    # the fleet's genuine grub boot still joins
    assert judge(el.boot(cert_der=ca_der()), cmdline_policy()) == "fleet"


def test_grub_chainloading_an_image_proves_no_line() -> None:
    """grub (a chain's loader) chainloads the kernel with arguments: grub measures the command,
    never a kernel_cmdline; root's appended pair does not make the line proven."""
    events = el.boot(cert_der=ca_der())
    at = next(i for i, e in enumerate(events) if e.data.startswith(b"grub_cmd: linux"))
    events[at : at + 2] = [el.grub("grub_cmd", f"chainloader {EVIL}")]
    events += [
        _root_extends(el.grub("grub_cmd", f"linux {ALLOWED}")),
        _root_extends(el.grub("kernel_cmdline", ALLOWED)),
    ]
    with pytest.raises(MeasuredBootViolation) as info:
        judge(events, cmdline_policy())
    assert info.value.code == "measured_boot_violation"
    assert "grub's chainloader command starts an image whose command line grub does not" in str(info.value)


def test_a_boot_option_after_the_loader_proves_no_line() -> None:
    """grub ran (and measured an allowed line), returned, and the firmware's next boot option
    started the kernel with other load options: the line grub measured is not the kernel's."""
    events = el.boot(cert_der=ca_der())
    kernel = len(events) - 1
    events[kernel:kernel] = [
        el.Ev(4, el.EV_EFI_ACTION, b"Returning from EFI Application from Boot Option"),
        el.Ev(4, el.EV_EFI_ACTION, b"Calling EFI Application from Boot Option"),
    ]
    with pytest.raises(MeasuredBootViolation) as info:
        judge(events, cmdline_policy())
    assert info.value.code == "measured_boot_violation"
    assert "'Returning from EFI Application from Boot Option' after the loader" in str(info.value)


@pytest.mark.parametrize("path", sorted(properties.UNMEASURED_PATHS))
def test_a_genuine_boot_through_each_unmeasured_path_joins_where_its_policy_allows_it(path: str) -> None:
    """Through the join service's own path: a class without kernel_cmdlines admits the boot, the
    same class with it refuses the boot for its unproven line only."""
    events = properties.unmeasured_boots()[path]
    assert judge(events, properties.no_cmdline_policy()) == "fleet"
    with pytest.raises(MeasuredBootViolation) as info:
        judge(events, properties.synthetic_policy())
    assert info.value.code == "measured_boot_violation"
    assert "(rule kernel_cmdlines)" in str(info.value)
    for rule in ("secure_boot", "authorities", "boot_applications", "dbx_required"):
        assert f"(rule {rule})" not in str(info.value)


def test_kernel_cmdlines_without_a_chain_is_refused_at_load() -> None:
    with pytest.raises(
        measuredboot.MeasuredBootPolicyError, match="kernel_cmdlines needs kernel_cmdline_chains"
    ):
        _policy(kernel_cmdlines=[ALLOWED])


def test_learn_writes_the_chain_up_to_the_loader() -> None:
    facts = bootfacts.facts(eventlog.parse(el.build(el.boot())).events, bank="sha256", pcrs=range(10))
    learned = measuredboot.learn([facts], cmdlines=True)
    assert learned.kernel_cmdline_chains == (tuple(CHAIN),)
    assert learned.kernel_cmdlines == (ALLOWED,)


# -- finding 6: authorities by subject name ----------------------------------------------------------


def test_a_certificate_with_the_allowed_subject_and_another_key_is_refused() -> None:
    policy = _policy(authorities=[sha256_of(ca_der())])
    assert judge(el.boot(cert_der=ca_der()), policy) == "fleet"
    with pytest.raises(MeasuredBootViolation) as info:
        judge(el.boot(cert_der=ca_der(twin=1)), policy)
    assert info.value.code == "measured_boot_violation"
    assert "authority CN=Fleet Secure Boot CA (db) is not allowed" in str(info.value)
    assert hashlib.sha256(ca_der(twin=1)).hexdigest() in str(info.value)


def test_a_subject_name_authority_is_refused_at_load() -> None:
    with pytest.raises(measuredboot.MeasuredBootPolicyError, match="is not a certificate digest"):
        _policy(authorities=["CN=Fleet Secure Boot CA"])
    upper = hashlib.sha256(ca_der()).hexdigest().upper()
    assert _policy(authorities=[upper]).classes[0].authorities == (sha256_of(ca_der()),)


def test_learn_writes_authorities_by_digest() -> None:
    facts = bootfacts.facts(
        eventlog.parse(el.build(el.boot(cert_der=ca_der()))).events, bank="sha256", pcrs=range(8)
    )
    assert measuredboot.learn([facts]).authorities == (sha256_of(ca_der()),)


# -- finding 8: banks no rule is defined over ---------------------------------------------------------


def _settings(bank: str, **measured_boot: Any) -> Settings:
    return Settings.model_validate(
        {"pcr_policy": {"bank": bank, "pcrs": list(range(10))}, "measured_boot": measured_boot}
    )


def test_sm3_with_measured_boot_is_refused_at_load() -> None:
    with pytest.raises(ValidationError, match=r"pcr_policy.bank sm3_256: .*no rule is defined over sm3_256"):
        _settings("sm3_256", secure_boot="required")
    assert _settings("sm3_256").pcr_policy.bank == "sm3_256"  # nothing enforced: the log is replayed


@pytest.mark.parametrize("bank", ["sha384", "sha1"])
def test_sha256_rules_on_another_bank_are_refused_at_load(bank: str) -> None:
    """boot_applications are Authenticode SHA-256s: a sha384 or sha1 quote vouches for another
    hash of the image, so the rule could never match (it silently refused every node before)."""
    with pytest.raises(ValidationError, match=f"boot_applications list SHA-256 digests.*the bank is {bank}"):
        _settings(bank, classes=[{"name": "x", "boot_applications": ["11" * 32]}])
    assert _settings(bank, secure_boot="required", classes=[{"name": "x", "dbx_required": ["aa" * 32]}])


def test_a_join_quoted_in_sm3_gets_403_naming_the_bank() -> None:
    """The join's guard behind the config check: no StopIteration (a 503), a 403 naming the bank."""
    events = el.boot()
    raw = el.build(events, banks=("sha1", "sm3_256"))
    policy = measuredboot.policy_from_obj({"secure_boot": "required"})
    with pytest.raises(MeasuredBootViolation) as info:
        judge_event_log(policy, raw, _quote(events, "sm3_256"), "node-a")
    assert info.value.code == "measured_boot_violation"
    assert attestation_status(info.value) == 403
    assert "sm3_256" in info.value.detail


def test_secure_boot_is_judged_in_a_sha384_quote() -> None:
    events = el.boot()
    raw = el.build(events, banks=("sha256", "sha384"))
    policy = measuredboot.policy_from_obj(
        {"secure_boot": "required", "classes": [{"name": "x", "dbx_required": ["aa" * 32]}]}
    )
    assert judge_event_log(policy, raw, _quote(events, "sha384"), "node-a") == "x"
    off = el.boot(secure=False)
    with pytest.raises(MeasuredBootViolation, match="Secure Boot is off"):
        judge_event_log(policy, el.build(off, banks=("sha256", "sha384")), _quote(off, "sha384"), "node-a")


# -- finding 10: vendor EFI action strings ------------------------------------------------------------


def hp_like(*, dma_nul: bool = True, extra: el.Ev | None = None) -> list[el.Ev]:
    """A boot shaped like the HP EliteBook 830 G6 log of the issue (Ubuntu 20.04, shim/grub): PCR 7
    opens with "DMA Protection Disabled" (here NUL-terminated, as some firmware logs it, digest of
    the logged bytes) and HP's "Security Level is Downgraded to 0" (digest of the string)."""
    dma = b"DMA Protection Disabled" + (b"\x00" if dma_nul else b"")
    events = el.boot(cert_der=ca_der())
    events[2:2] = [el.Ev(7, el.EV_EFI_ACTION, dma), el.Ev(7, el.EV_EFI_ACTION, SECURITY_LEVEL_0)]
    return [*events, extra] if extra is not None else events


def _facts(events: list[el.Ev]) -> bootfacts.BootFacts:
    return bootfacts.facts(eventlog.parse(el.build(events)).events, bank="sha256", pcrs=range(10))


def test_the_profiles_dma_string_is_read_with_or_without_its_nul() -> None:
    for nul in (True, False):
        facts = _facts(hp_like(dma_nul=nul))
        assert facts.problems(7) == ()
        assert [a.text for a in facts.vendor_actions] == [SECURITY_LEVEL_0.decode()]


def test_a_vendor_action_passes_only_where_the_class_names_it() -> None:
    rules = {"secure_boot": "required", "authorities": [sha256_of(ca_der())]}
    with pytest.raises(MeasuredBootViolation) as info:
        judge(hp_like(), _policy(**rules))
    assert info.value.code == "measured_boot_violation"
    assert "event 4 (PCR 7, EV_EFI_ACTION): EFI action 'Security Level is Downgraded to 0' is not one" in str(
        info.value
    )
    assert judge(hp_like(), _policy(**rules, efi_actions=[SECURITY_LEVEL_0.decode()])) == "fleet"


def test_a_vendor_action_whose_digest_is_not_its_string_is_refused() -> None:
    """An allowed string as data, over another event's digest (a relabelled authority): the TPM
    does not vouch for the text, so it is no action at all."""
    policy = _policy(
        secure_boot="required", authorities=[sha256_of(ca_der())], efi_actions=[SECURITY_LEVEL_0.decode()]
    )
    events = hp_like()
    auth = next(i for i, e in enumerate(events) if e.type == el.EV_EFI_VARIABLE_AUTHORITY)
    events[auth] = el.Ev(
        7, el.EV_EFI_ACTION, SECURITY_LEVEL_0, digests={b: events[auth].digest(b) for b in ("sha1", "sha256")}
    )
    with pytest.raises(MeasuredBootViolation) as info:
        judge(events, policy)
    assert info.value.code == "measured_boot_violation"
    assert f"event {auth + 1} (PCR 7, EV_EFI_ACTION): not an action string" in str(info.value)


def test_uefi_debug_mode_cannot_be_allowed() -> None:
    with pytest.raises(measuredboot.MeasuredBootPolicyError, match="UEFI Debug Mode is never allowed"):
        _policy(secure_boot="required", efi_actions=["UEFI Debug Mode"])


def _learn(tmp_path: Path, capsys: pytest.CaptureFixture[str], events: list[el.Ev]) -> tuple[int, str, str]:
    path = tmp_path / "binary_bios_measurements"
    path.write_bytes(el.build(events))
    code = cli.main(["policy", "learn", "--name", "hp", "--event-log", str(path), "--kernel-cmdlines"])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_learn_admits_an_hp_log_and_writes_its_action(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _learn(tmp_path, capsys, hp_like())
    assert (code, err) == (0, "")
    assert "- Security Level is Downgraded to 0" in out
    assert "efi_actions:" in out
    assert sha256_of(ca_der()) in out
    assert "# CN=Fleet Secure Boot CA" in out


def test_learn_says_in_one_line_that_a_debug_mode_log_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _learn(tmp_path, capsys, hp_like(extra=el.Ev(7, el.EV_EFI_ACTION, b"UEFI Debug Mode")))
    assert code == 1
    assert out == ""
    assert len(err.splitlines()) == 1
    assert "UEFI debug mode" in err
    assert "no class admits" in err
    with pytest.raises(MeasuredBootViolation, match="UEFI debug mode"):
        judge(
            hp_like(extra=el.Ev(7, el.EV_EFI_ACTION, b"UEFI Debug Mode")),
            _policy(secure_boot="required", efi_actions=[SECURITY_LEVEL_0.decode()]),
        )
