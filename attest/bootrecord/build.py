"""Build a node's boot record from what its accepted attestation verified. Pure.

The input is what the verdict read: the quoted (signed) PCR values, and the facts of the event
log in the quoted bank and PCRs (``attest.measuredboot.facts``), the very object the
measured-boot policy judged. Only those facts reach the record, so an event in a PCR the quote
does not cover, or data the event's digest does not cover (a boot application's device path, an
event's type outside what the profile defines), never does. :func:`record_facts` gives the join
and the record one way to choose the bank and the PCRs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from attest.bootrecord import model
from attest.errors import EventLogInvalid
from attest.measuredboot import facts as bootfacts
from attest.measuredboot.events import GRUB_IMAGE_COMMANDS, Action, VendorAction
from attest.measuredboot.log import EventLog
from attest.measuredboot.model import JUDGED_BANKS, MeasuredBootPolicy
from attest.measuredboot.tcglog import EV_S_CRTM_VERSION, Event, hasher
from attest.quote import Counters

__all__ = ["Built", "build_record", "event_ref", "record_facts"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Built:
    record: model.BootRecord
    # dbx identity -> its image digests (32 bytes each, sorted, concatenated): kept once per
    # distinct dbx (a fleet has a handful), so a what-if can judge a new dbx_required.
    dbx: dict[str, bytes]


def judged_facts_bank(quoted: Collection[str]) -> str | None:
    """The bank whose events are interpreted: the first the interpreter reads that the quote
    covers (``attest.measuredboot.model.judged_bank`` picks the same one for a policy)."""
    return next((b for b in JUDGED_BANKS if b in quoted), None)


def record_facts(log: EventLog, quoted: Mapping[str, Mapping[int, bytes]]) -> bootfacts.BootFacts | None:
    """The facts of a replayed ``log`` in the quoted bank and PCRs: what the measured-boot policy
    judges and the record keeps (None: the quote covers no bank the interpreter reads)."""
    bank = judged_facts_bank(quoted)
    if bank is None:
        return None
    return bootfacts.facts(log.events, bank=bank, pcrs=frozenset(quoted[bank]))


def event_ref(ev: Event) -> tuple[int, int, int]:
    return (ev.number, ev.pcr, ev.type)


def build_record(
    *,
    attested_at: datetime,
    quoted: Mapping[str, Mapping[int, bytes]],
    boot_id: str | None = None,
    counters: Counters | None = None,
    pcr_class: str | None = None,
    firmware_version: int | None = None,
    ek: model.EkFacts | None = None,
    log: EventLog | None = None,
    facts: bootfacts.BootFacts | None = None,
    policy: MeasuredBootPolicy | None = None,
    matched_class: str | None = None,
) -> Built:
    """The record of one accepted attestation. ``log`` None: the node sent none. ``facts`` are
    :func:`record_facts` of it (None when no bank is interpreted); ``policy`` and
    ``matched_class`` are what judged them: a kernel command line is recorded as proven only when
    the matched class requires one (its proof, ``kernel_cmdline_chains``, then held)."""
    dbx: dict[str, bytes] = {}
    mb = None
    if log is not None:
        mb, dbx = _measured_boot(log, quoted, facts, policy, matched_class)
    record = model.BootRecord(
        version=model.RECORD_VERSION,
        attested_at=attested_at,
        boot_id=boot_id,
        reset_count=counters.reset_count if counters is not None else None,
        pcrs={bank: {i: v.hex() for i, v in sorted(values.items())} for bank, values in quoted.items()},
        pcr_class=pcr_class,
        measured_boot=mb,
        ek=ek,
        tpm=_tpm(firmware_version),
    )
    return Built(record, dbx)


def _tpm(firmware_version: int | None) -> model.TpmFacts | None:
    if firmware_version is None:
        return None
    v = firmware_version
    return model.TpmFacts(firmware_version=".".join(str((v >> s) & 0xFFFF) for s in (48, 32, 16, 0)))


def _capped(items: Sequence[T], cap: int, name: str, truncated: list[str]) -> tuple[T, ...]:
    if len(items) > cap:
        truncated.append(name)
    return tuple(items[:cap])


def _measured_boot(
    log: EventLog,
    quoted: Mapping[str, Mapping[int, bytes]],
    facts: bootfacts.BootFacts | None,
    policy: MeasuredBootPolicy | None,
    matched_class: str | None,
) -> tuple[model.MeasuredBootFacts, dict[str, bytes]]:
    bank = facts.bank if facts is not None else next(iter(quoted), "")
    crtm = _crtm_version(log, bank, quoted.get(bank, {}))
    if facts is None:  # no bank the interpreter reads: nothing but what PCR 0 names
        return model.MeasuredBootFacts(bank=bank, crtm_version=crtm), {}
    truncated: list[str] = []
    authorities = _capped(
        [
            model.Authority(
                variable=a.variable, sha256=a.sha256, subject=_text(a.subject), event=event_ref(a.event)
            )
            for a in facts.authorities
        ],
        model.MAX_AUTHORITIES,
        "authorities",
        truncated,
    )
    apps = _capped(
        [model.BootApplication(digest=a.digest, event=event_ref(a.event)) for a in facts.boot_applications],
        model.MAX_APPLICATIONS,
        "bootApplications",
        truncated,
    )
    lines = []
    for line in facts.kernel_cmdlines:
        if len(line.text) > model.MAX_CMDLINE_CHARS:
            truncated.append("cmdlines")
            break
        lines.append(model.Cmdline(text=line.text, event=event_ref(line.event)))
    cmdlines = _capped(lines, model.MAX_CMDLINES, "cmdlines", truncated)
    commands = _capped(
        [
            model.LoaderCommand(command=c.command[:64], event=event_ref(c.event))
            for c in facts.grub_commands
            if c.word in GRUB_IMAGE_COMMANDS
        ],
        model.MAX_LOADER_COMMANDS,
        "loaderCommands",
        truncated,
    )
    actions = _capped(
        [
            model.Action(text=t.text, vendor=isinstance(t, VendorAction), event=event_ref(t.event))
            for t in facts.typed
            if isinstance(t, Action | VendorAction)
        ],
        model.MAX_ACTIONS,
        "actions",
        truncated,
    )
    problems = _capped(
        [
            model.Problem(
                pcr=u.pcr,
                reason=_text(u.reason) or "",
                event=event_ref(u.event) if u.event is not None else None,
            )
            for u in facts.uninterpreted
        ],
        model.MAX_UNINTERPRETED,
        "uninterpreted",
        truncated,
    )
    dbx_var = facts.keys.get("dbx")
    dbx_id = None
    contents: dict[str, bytes] = {}
    if dbx_var is not None:
        entries = sorted(dbx_var.sha256_entries)
        digest = hashlib.sha256(dbx_var.value).hexdigest()
        dbx_id = model.DbxIdentity(sha256=digest, entries=len(entries), event=event_ref(dbx_var.event))
        contents[digest] = b"".join(entries)
    secure_event = facts.secure_boot_event
    mb = model.MeasuredBootFacts(
        bank=facts.bank,
        matched_class=matched_class,
        secure_boot=facts.secure_boot,
        secure_boot_event=event_ref(secure_event) if secure_event is not None else None,
        debug_mode=event_ref(facts.debug_mode) if facts.debug_mode is not None else None,
        crtm_version=crtm,
        authorities=authorities,
        dbx=dbx_id,
        boot_applications=apps,
        kernel_cmdline=_proven_cmdline(facts, policy, matched_class),
        cmdlines=cmdlines,
        loader_commands=commands,
        actions=actions,
        uninterpreted=problems,
        truncated=tuple(truncated),
    )
    return mb, contents


def _proven_cmdline(
    facts: bootfacts.BootFacts, policy: MeasuredBootPolicy | None, matched_class: str | None
) -> str | None:
    """The kernel's command line when the class that admitted the boot proved it: it requires
    kernel_cmdlines, which hold only with the chain proof (attest.measuredboot.policy). The last
    line measured is the one grub started the kernel with."""
    if policy is None or matched_class is None or not facts.kernel_cmdlines:
        return None
    cls = next((c for c in policy.classes if c.name == matched_class), None)
    if cls is None or cls.kernel_cmdlines is None:
        return None
    text = facts.kernel_cmdlines[-1].text
    return text if len(text) <= model.MAX_CMDLINE_CHARS else None


def _crtm_version(log: EventLog, bank: str, quoted: Mapping[int, bytes]) -> str | None:
    """The firmware's EV_S_CRTM_VERSION string (PCR 0), when PCR 0 is quoted and the event's
    digest is that of its data (the profile measures the version string itself)."""
    if 0 not in quoted:
        return None
    try:
        h = hasher(bank)
    except EventLogInvalid:  # a bank this Python cannot hash (SM3 without OpenSSL's)
        return None
    for ev in log.events:
        if ev.pcr != 0 or ev.type != EV_S_CRTM_VERSION:
            continue
        digest = ev.digests.get(bank)
        if digest is None or h(ev.data).digest() != digest:
            return None
        return _version_text(ev.data)
    return None


def _version_text(data: bytes) -> str | None:
    """UTF-16 (what EDK II writes) or ASCII, without the trailing NULs."""
    for encoding in ("utf-16-le", "ascii"):
        if encoding == "utf-16-le" and len(data) % 2:
            continue
        try:
            text = data.decode(encoding).rstrip("\x00")
        except UnicodeDecodeError:
            continue
        if text and text.isprintable():
            return text[: model.MAX_TEXT]
    return None


def _text(value: str | None) -> str | None:
    if value is None:
        return None
    return "".join(c if c.isprintable() else "?" for c in value)[: model.MAX_TEXT]
