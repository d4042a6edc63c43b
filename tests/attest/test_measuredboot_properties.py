"""Properties of the measured-boot verdict under everything the TPM does not sign (hypothesis).

For a log and a policy, an attacker with root after boot can change any event's type or data
while keeping its digests (the replay still matches the quote), and append any event after
extending its digest into the PCR. Then:

- a log the policy refuses stays refused (no such change makes a refused boot pass);
- a log the policy accepts is either refused after the change, or the change is provably
  irrelevant: it is in a PCR none of the policy's rules reads, or every fact the policy judged
  is still there unchanged (Secure Boot, the key databases, the debug flag), nothing vouched for
  disappeared (authorities, boot applications, command lines), and whatever it added is allowed
  by the class that matched anyway.

The bases are synthetic boots (accepted or refused for each rule), boots that measured no kernel
command line into PCR 8 (shim or the firmware starting the kernel with load options, grub's
chainloader, systemd-boot v251+ with a UKI measuring into PCR 12: refused by a class with
``kernel_cmdlines``, whatever root appends; issue 33 finding 2), and real firmware logs from the
shared test data with a class learned from each (accepted) or that class minus one entry (refused).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from functools import cache
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attest import eventlog
from attest.errors import AttestationError
from attest.measuredboot import events as typed
from attest.measuredboot import facts as bootfacts
from attest.measuredboot import policy as measuredboot
from attest.measuredboot.tcglog import EV_NO_ACTION, EVENT_TYPES
from tests.support import eventlogs as el
from tests.support.certs import ca_der
from tests.support.shared_data import shared

LOGS = shared("eventlogs")
REAL = [
    "gce-rhel8-uefi.bin",
    "keylime-secureboot.bin",
    "tools-moklisttrusted.bin",
    "gce-ubuntu-2404-amd-sev-snp.bin",
    "arch-linux-workstation.bin",
    "gce-cos-85-amd-sev.bin",
    "tss-pc-client.bin",
    "gdc-host.bin",
]
QUOTED = range(10)
SHIM, GRUB, KERNEL, SD_BOOT, UKI = (bytes([b]) * 32 for b in (0x11, 0x22, 0x33, 0x55, 0x66))
ALLOWED_CMDLINE = "/vmlinuz-6.8 root=/dev/sda1 ro"

# The certificates and the policies are made when a test first asks (cache), not at import: a
# refusal by the installed cryptography or by the policy loader fails those tests, not the collection.


def synthetic_class() -> dict[str, Any]:
    return {
        "name": "fleet",
        "secure_boot": "required",
        "authorities": ["sha256:" + hashlib.sha256(ca_der()).hexdigest()],
        "dbx_required": ["aa" * 32],
        # systemd-boot and the UKI are allowed too: a boot through them fails only kernel_cmdlines
        "boot_applications": [d.hex() for d in (SHIM, GRUB, KERNEL, SD_BOOT, UKI)],
        "kernel_cmdlines": [ALLOWED_CMDLINE],
        "kernel_cmdline_chains": [[SHIM.hex(), GRUB.hex()]],
    }


@cache
def synthetic_policy() -> measuredboot.MeasuredBootPolicy:
    return measuredboot.policy_from_obj({"classes": [synthetic_class()]})


@cache
def no_cmdline_policy() -> measuredboot.MeasuredBootPolicy:
    """The same class without kernel_cmdlines: each boot path below joins where its policy allows it."""
    return measuredboot.policy_from_obj(
        {
            "classes": [
                {
                    k: v
                    for k, v in synthetic_class().items()
                    if k not in ("kernel_cmdlines", "kernel_cmdline_chains")
                }
            ]
        }
    )


TYPES = sorted({*EVENT_TYPES, 0x800000FF, 0x0000FFFF})
# The types the interpreter gives a meaning to: where a relabelled event could do harm.
HANDLED = [
    el.EV_SEPARATOR,
    0x00000005,  # EV_ACTION
    el.EV_EFI_ACTION,
    el.EV_EFI_VARIABLE_DRIVER_CONFIG,
    el.EV_EFI_VARIABLE_AUTHORITY,
    el.EV_EFI_BOOT_SERVICES_APPLICATION,
    el.EV_IPL,
]


@cache
def crafted_events() -> list[el.Ev]:
    return [
        el.secure_boot(True),
        el.dbx(b"\xaa" * 32, b"\xbb" * 32, b"\xcc" * 32),
        el.grub("grub_cmd", "linux /vmlinuz-6.8 root=/dev/sda1 ro"),
        el.grub("kernel_cmdline", "/vmlinuz-6.8 root=/dev/sda1 ro"),
        el.separator(7),
        el.separator(4),
        el.authority(ca_der()),
        el.application(b"\x11" * 32),
        el.application(GRUB, "\\EFI\\ubuntu\\grubx64.efi"),  # root claims grub ran after all
        el.Ev(7, el.EV_EFI_ACTION, b"DMA Protection Disabled"),
        el.Ev(7, el.EV_EFI_ACTION, b"Security Level is Downgraded to 0"),
        el.Ev(4, el.EV_EFI_ACTION, b"Calling EFI Application from Boot Option"),
    ]


FLAWS = ["none", "secure-boot-off", "evil-authority", "evil-cmdline", "evil-shim", "dbx-missing"]
EVIL_LOAD_OPTIONS = "/vmlinuz-6.8 init=/bin/sh lockdown=none"


def _load_options(text: str) -> el.Ev:
    """What a loader that measures no line into PCR 8 leaves: the kernel gets ``text`` as its
    UTF-16 LoadOptions (shim, the firmware's boot manager) or systemd-stub measures it into
    PCR 12; either way nothing a kernel_cmdlines rule can read."""
    data = (text + "\x00").encode("utf-16-le")
    return el.Ev(12, el.EV_IPL, data)


UNMEASURED_PATHS = ("shim-kernel", "db-signed-kernel", "grub-chainloader", "systemd-boot-uki")


@cache
def unmeasured_boots() -> dict[str, list[el.Ev]]:
    """Genuine boots of the fleet's Secure Boot setup through paths that put no kernel command
    line into PCR 8 (issue 33 finding 2); each ran a kernel with ``EVIL_LOAD_OPTIONS``."""
    head = el.boot(cert_der=ca_der())[:15]  # CRTM, PCR 7's configuration, separators 0-7
    auth = el.authority(ca_der())
    shim = el.application(SHIM, "\\EFI\\ubuntu\\shimx64.efi")
    kernel = el.application(KERNEL, "\\vmlinuz-6.8")
    boots = {
        "shim-kernel": [*head, auth, shim, kernel, _load_options(EVIL_LOAD_OPTIONS)],
        "db-signed-kernel": [*head, auth, kernel, _load_options(EVIL_LOAD_OPTIONS)],
        "grub-chainloader": [
            *head,
            auth,
            shim,
            el.application(GRUB, "\\EFI\\ubuntu\\grubx64.efi"),
            el.grub("grub_cmd", "set root=hd0,gpt2"),
            el.grub("grub_cmd", f"chainloader {EVIL_LOAD_OPTIONS}"),
            kernel,
        ],
        "systemd-boot-uki": [
            *head,
            auth,
            el.application(SD_BOOT, "\\EFI\\systemd\\systemd-bootx64.efi"),
            el.application(UKI, "\\EFI\\Linux\\linux-6.8.efi"),
            _load_options(EVIL_LOAD_OPTIONS),
        ],
    }
    assert tuple(boots) == UNMEASURED_PATHS
    return boots


def _to_ev(ev: eventlog.Event) -> el.Ev:
    return el.Ev(ev.pcr, ev.type, ev.data, digests=dict(ev.digests))


def _build(events: list[el.Ev], banks: tuple[str, ...]) -> bytes:
    return el.build_sha1(events) if banks == ("sha1",) else el.build(events, banks=banks)


@cache
def _real(name: str) -> tuple[list[el.Ev], tuple[str, ...], str]:
    log = eventlog.parse(LOGS.read(name))
    bank = bootfacts.preferred_bank(log.banks)
    assert bank is not None
    return [_to_ev(e) for e in log.events if not (e.number == 0 and log.spec)], log.banks, bank


def _facts(events: list[el.Ev], banks: tuple[str, ...], bank: str) -> bootfacts.BootFacts:
    log = eventlog.parse(_build(events, banks))
    return bootfacts.facts(log.events, bank=bank, pcrs=QUOTED)


@cache
def _learned(name: str) -> measuredboot.MeasuredBootClass:
    events, banks, bank = _real(name)
    return measuredboot.learn([_facts(events, banks, bank)], name="learned", cmdlines=True)


def _without_one(cls: measuredboot.MeasuredBootClass) -> measuredboot.MeasuredBootClass | None:
    """The learned class minus one allowed entry: the log's boot breaks exactly one rule."""
    for rule in ("boot_applications", "authorities", "kernel_cmdlines"):
        values = getattr(cls, rule)
        if values:
            return cls.model_copy(update={rule: values[1:]})
    return None


def _view(f: bootfacts.BootFacts) -> dict[str, Any]:
    """What the policy judges, without what is only shown to people (paths)."""
    return {
        "secure_boot": f.secure_boot,
        "debug": f.debug_mode is not None,
        "keys": {k: v.value for k, v in f.keys.items()},
        "authorities": Counter("sha256:" + a.sha256 for a in f.authorities),
        "apps": Counter(a.digest for a in f.boot_applications),
        "cmdlines": Counter(t.text for t in f.kernel_cmdlines),
    }


def _allowed(cls: measuredboot.MeasuredBootClass, kind: str, item: str) -> bool:
    rule = {"authorities": "authorities", "apps": "boot_applications", "cmdlines": "kernel_cmdlines"}[kind]
    values = getattr(cls, rule)
    return values is None or item in values


def _specials(events: list[el.Ev]) -> list[bytes]:
    """Data an attacker would try: what the interpreter reads as something, and each grub text
    under every other grub prefix."""
    pool = [b"\x00" * 4, b"\xff" * 4, b"", *typed.EFI_ACTIONS]
    pool += [el.secure_boot(True).data, el.dbx(b"\xaa" * 32, b"\xcc" * 32).data]
    pool += [el.grub("kernel_cmdline", "/vmlinuz-6.8 root=/dev/sda1 ro").data]
    for e in events:
        if e.pcr == 8:
            for prefix, _, _ in typed.GRUB_PREFIXES:
                if e.data.startswith(prefix):
                    body = e.data[len(prefix) :]
                    pool += [p + body for p, _, _ in typed.GRUB_PREFIXES]
    return pool


def _variants(events: list[el.Ev]) -> list[bytes]:
    return [d for e in events[:200] for d in (e.data, e.data[:-1], e.data + b"\x00")]


@st.composite
def _base(draw: st.DrawFn) -> tuple[list[el.Ev], tuple[str, ...], str, measuredboot.MeasuredBootPolicy]:
    which = draw(st.sampled_from(["synthetic", "unmeasured", "real"]))
    if which == "unmeasured":  # refused only for its unproven command line
        events = unmeasured_boots()[draw(st.sampled_from(sorted(UNMEASURED_PATHS)))]
        return list(events), ("sha1", "sha256"), "sha256", synthetic_policy()
    if which == "synthetic":  # a synthetic boot with at most one flaw, so the others cannot mask it
        flaw = draw(st.sampled_from(FLAWS))
        events = el.boot(
            secure=flaw != "secure-boot-off",
            cert_der=ca_der("Attacker db key") if flaw == "evil-authority" else ca_der(),
            kernel="/vmlinuz-6.8 init=/bin/sh"
            if flaw == "evil-cmdline"
            else "/vmlinuz-6.8 root=/dev/sda1 ro",
            shim=b"\x44" * 32 if flaw == "evil-shim" else b"\x11" * 32,
        )
        if flaw == "dbx-missing":
            events[3] = el.dbx(b"\xbb" * 32)
        return events, ("sha1", "sha256"), "sha256", synthetic_policy()
    name = draw(st.sampled_from(REAL))
    events, banks, bank = _real(name)
    cls = _learned(name)
    if draw(st.booleans()):
        cls = _without_one(cls) or cls
    return list(events), banks, bank, measuredboot.MeasuredBootPolicy(classes=(cls,))


@st.composite
def _mutation(draw: st.DrawFn, events: list[el.Ev], banks: tuple[str, ...]) -> tuple[str, list[el.Ev], int]:
    """(what, the changed events, the PCR touched)."""
    data = st.one_of(
        st.sampled_from(_specials(events)), st.sampled_from(_variants(events)), st.binary(max_size=64)
    )
    types = st.one_of(st.sampled_from(HANDLED), st.sampled_from(TYPES))
    kind = draw(st.sampled_from(["type", "data", "both", "append"]))
    out = list(events)
    if kind == "append" and draw(st.booleans()):  # root extends what would make the boot pass
        crafted = draw(st.sampled_from(crafted_events()))
        out.append(
            el.Ev(crafted.pcr, crafted.type, crafted.data, digests={b: crafted.digest(b) for b in banks})
        )
        return kind, out, crafted.pcr
    if kind == "append":
        pcr = draw(st.sampled_from([4, 7, 8, 0, 5, 9]))
        new_type = draw(types)
        body = draw(data)
        how = draw(st.sampled_from(["hash", "copy", "random"]))
        if how == "hash":
            digests = {b: hashlib.new(b, body).digest() for b in banks}
        elif how == "copy":
            digests = dict(draw(st.sampled_from(events)).digests)
        else:
            digests = {b: draw(st.binary(min_size=el.ALGS[b][1], max_size=el.ALGS[b][1])) for b in banks}
        if new_type == EV_NO_ACTION:
            new_type = 0x800000FF  # an EV_NO_ACTION is never extended: nothing to append
        out.append(el.Ev(pcr, new_type, body, digests=digests))
        return kind, out, pcr
    candidates = [i for i, e in enumerate(events) if e.type != EV_NO_ACTION]
    judged = [i for i in candidates if events[i].pcr in typed.JUDGED_PCRS]
    i = draw(st.one_of(st.sampled_from(judged), st.sampled_from(candidates)))
    old = events[i]
    new_type = draw(types) if kind in ("type", "both") else old.type
    if new_type == EV_NO_ACTION:
        new_type = 0x800000FF  # retyping to EV_NO_ACTION changes the replay: not digest-preserving
    body = draw(data) if kind in ("data", "both") else old.data
    out[i] = el.Ev(old.pcr, new_type, body, digests={b: old.digest(b) for b in banks})
    return kind, out, old.pcr


def _judged_pcrs(policy: measuredboot.MeasuredBootPolicy) -> set[int]:
    return {pcr for rule in policy.rules() for pcr in measuredboot.RULE_PCRS[rule]}


def _check(
    base: tuple[list[el.Ev], tuple[str, ...], str, measuredboot.MeasuredBootPolicy], draw: Callable[..., Any]
) -> None:
    events, banks, bank, policy = base
    before = _facts(events, banks, bank)
    verdict = measuredboot.evaluate(policy, before)
    changed, kinds, pcrs = events, [], set()
    for _ in range(draw(st.integers(1, 2))):  # some attacks take two steps (relabel, then append)
        kind, changed, pcr = draw(_mutation(changed, banks))
        kinds.append(kind)
        pcrs.add(pcr)
    kind, pcr = "+".join(kinds), ",".join(map(str, sorted(pcrs)))
    try:
        after = _facts(changed, banks, bank)
    except AttestationError:
        return  # the changed log does not even parse: refused
    result = measuredboot.evaluate(policy, after)
    if not verdict.ok:
        assert not result.ok, f"{kind} in PCR {pcr} turned a refusal into a pass"
        return
    if not result.ok or not pcrs & _judged_pcrs(policy):
        return
    cls = next(c for c in policy.classes if c.name == result.matched_class)
    old, new = _view(before), _view(after)
    for key in ("secure_boot", "debug", "keys"):
        assert old[key] == new[key], f"{kind} in PCR {pcr} changed {key} and passed"
    for key in ("authorities", "apps", "cmdlines"):
        assert not (old[key] - new[key]), f"{kind} in PCR {pcr} hid {key} {old[key] - new[key]} and passed"
        assert all(_allowed(cls, key, item) for item in new[key] - old[key])


@settings(
    max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(base=_base(), data=st.data())
def test_unsigned_changes_never_turn_a_verdict(
    base: tuple[list[el.Ev], tuple[str, ...], str, measuredboot.MeasuredBootPolicy], data: st.DataObject
) -> None:
    _check(base, data.draw)


def test_the_bases_cover_both_verdicts() -> None:
    """The property above is only worth something if its bases include accepted and refused logs."""
    accepted = [
        n
        for n in REAL
        if measuredboot.evaluate(
            measuredboot.MeasuredBootPolicy(classes=(_learned(n),)), _facts(*_real(n))
        ).ok
    ]
    assert accepted == REAL
    refused = []
    for n in REAL:
        cls = _without_one(_learned(n))
        if cls is not None:
            refused.append(
                measuredboot.evaluate(measuredboot.MeasuredBootPolicy(classes=(cls,)), _facts(*_real(n))).ok
            )
    assert refused
    assert not any(refused)
    assert measuredboot.evaluate(
        synthetic_policy(), _facts(el.boot(cert_der=ca_der()), ("sha1", "sha256"), "sha256")
    ).ok


# -- focused: grub's unsigned prefixes in PCR 8 ------------------------------------------------------


@cache
def _grub_bases() -> list[tuple[list[el.Ev], tuple[str, ...], str, measuredboot.MeasuredBootPolicy]]:
    """Refused boots whose only flaw is the kernel command line: a synthetic one and each real log
    with grub (its learned class without its command line)."""
    out = [
        (el.boot(kernel="/vmlinuz-6.8 init=/bin/sh"), ("sha1", "sha256"), "sha256", synthetic_policy()),
    ]
    for name in REAL:
        events, banks, bank = _real(name)
        cls = _learned(name)
        if cls.kernel_cmdlines and any(e.pcr == 8 and e.data.startswith(b"grub") for e in events):
            refused = cls.model_copy(update={"kernel_cmdlines": ("/vmlinuz-6.8 root=/dev/sda1 ro",)})
            out.append((list(events), banks, bank, measuredboot.MeasuredBootPolicy(classes=(refused,))))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.deferred(lambda: st.integers(0, len(_grub_bases()) - 1)), data=st.data())
def test_relabelled_grub_text_and_appended_lines_never_pass(which: int, data: st.DataObject) -> None:
    """Every grub text under any other grub prefix (same digest), plus root appending any allowed
    command or command line to PCR 8: a boot refused for its command line stays refused."""
    events, banks, bank, policy = _grub_bases()[which]
    assert not measuredboot.evaluate(policy, _facts(events, banks, bank)).ok
    changed = list(events)
    grub = [
        i
        for i, e in enumerate(events)
        if e.pcr == 8 and any(e.data.startswith(p) for p, _, _ in typed.GRUB_PREFIXES)
    ]
    for i in data.draw(st.lists(st.sampled_from(grub), max_size=3, unique=True)):
        old = changed[i]
        prefix = next(p for p, _, _ in typed.GRUB_PREFIXES if old.data.startswith(p))
        new_prefix = data.draw(st.sampled_from([p for p, _, _ in typed.GRUB_PREFIXES]))
        changed[i] = el.Ev(
            8, old.type, new_prefix + old.data[len(prefix) :], digests={b: old.digest(b) for b in banks}
        )
    for text in data.draw(
        st.lists(
            st.sampled_from(
                [
                    "grub_cmd: linux /vmlinuz-6.8 root=/dev/sda1 ro",
                    "kernel_cmdline: /vmlinuz-6.8 root=/dev/sda1 ro",
                ]
            ),
            max_size=2,
        )
    ):
        prefix, _, body = text.partition(": ")
        extra = el.grub(prefix, body)
        changed.append(el.Ev(8, extra.type, extra.data, digests={b: extra.digest(b) for b in banks}))
    assert not measuredboot.evaluate(policy, _facts(changed, banks, bank)).ok


# -- focused: boots that measured no command line into PCR 8 (issue 33 finding 2) -----------------

ROOT_APPENDS = [
    el.grub("grub_cmd", f"linux {ALLOWED_CMDLINE}"),
    el.grub("kernel_cmdline", ALLOWED_CMDLINE),
    el.application(SHIM, "\\EFI\\ubuntu\\shimx64.efi"),
    el.application(GRUB, "\\EFI\\ubuntu\\grubx64.efi"),
    el.Ev(4, el.EV_EFI_ACTION, b"Calling EFI Application from Boot Option"),
    el.separator(4),
    el.Ev(8, el.EV_IPL, (ALLOWED_CMDLINE + "\x00").encode("utf-16-le")),  # systemd-boot's form
]


def test_unmeasured_paths_are_refused_for_their_line_and_join_without_the_rule() -> None:
    """Each path's honest log: refused by a class with kernel_cmdlines (its line is not proven),
    admitted by the same class without that rule (a genuine boot joins where its policy allows)."""
    for name, events in unmeasured_boots().items():
        facts = _facts(events, ("sha1", "sha256"), "sha256")
        refused = measuredboot.evaluate(synthetic_policy(), facts)
        assert not refused.ok, name
        assert {f.rule for f in refused.violations} == {"kernel_cmdlines"}, (name, refused.reason)
        assert measuredboot.evaluate(no_cmdline_policy(), facts).matched_class == "fleet", name


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.sampled_from(sorted(UNMEASURED_PATHS)), data=st.data())
def test_appended_events_never_prove_an_unmeasured_command_line(which: str, data: st.DataObject) -> None:
    """Root extends PCRs 4 and 8 with any sequence of what a measured grub boot shows (grub's
    linux command and an allowed line, shim and grub as applications, systemd-boot's line) and
    appends the events: the boot that ran the kernel with an unmeasured line stays refused."""
    events = list(unmeasured_boots()[which])
    for ev in data.draw(st.lists(st.sampled_from(ROOT_APPENDS), min_size=1, max_size=5)):
        events.append(el.Ev(ev.pcr, ev.type, ev.data, digests={b: ev.digest(b) for b in ("sha1", "sha256")}))
    result = measuredboot.evaluate(synthetic_policy(), _facts(events, ("sha1", "sha256"), "sha256"))
    assert not result.ok, f"{which}: appended events made an unmeasured line pass"
