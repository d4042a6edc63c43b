"""``nodegate eventlog inspect`` and ``nodegate policy learn``: measured-boot logs, offline.

    nodegate eventlog inspect /sys/kernel/security/tpm0/binary_bios_measurements [-o json] [--events]
    nodegate policy learn --event-log good1.bin --event-log good2.bin [--name gpu-a] [--kernel-cmdlines]

Exit codes: 0 done, 1 a log that is not a valid event log (the reason and its code are printed),
2 a file that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from attest import eventlog
from attest.errors import AttestationError
from attest.filekind import describe as what_file_is
from attest.measuredboot import facts as bootfacts
from attest.measuredboot import policy as measuredboot
from attest.measuredboot.tcglog import Event
from bootstrap.cli import mbcheck

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


class _Unreadable(Exception):
    pass


def _read(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(eventlog.MAX_LOG_BYTES + 1)
    except OSError as exc:
        raise _Unreadable(f"{path}: {exc.strerror}") from None
    return data


def _event(ev: Event) -> dict[str, Any]:
    return {
        "number": ev.number,
        "pcr": ev.pcr,
        "type": ev.type_name,
        "digests": {bank: d.hex() for bank, d in ev.digests.items()},
        "size": len(ev.data),
    }


def describe(log: eventlog.EventLog, *, events: bool = False) -> dict[str, Any]:
    """The JSON of ``nodegate eventlog inspect``: counts, banks, replayed PCRs, Secure Boot, and
    what a measured-boot policy would read (nothing here is trusted until a quote covers it)."""
    bank = bootfacts.preferred_bank(log.banks)
    facts = bootfacts.facts(log.events, bank=bank) if bank else None
    out: dict[str, Any] = {
        "events": len(log.events),
        "banks": list(log.banks),
        "pcrs": {b: {str(i): v.hex() for i, v in sorted(vals.items())} for b, vals in log.replay().items()},
        "secure_boot": log.secure_boot,
        "startup_locality": log.startup_locality,
        "hcrtm": log.hcrtm,
    }
    if facts is not None:
        out["facts_bank"] = facts.bank
        out["authorities"] = [
            {"event": a.event.number, "variable": a.variable, "subject": a.subject, "sha256": a.sha256}
            for a in facts.authorities
        ]
        out["boot_applications"] = [
            {"event": a.event.number, "pcr": a.event.pcr, "digest": a.digest, "path": a.path}
            for a in facts.boot_applications
        ]
        out["kernel_cmdlines"] = [{"event": t.event.number, "text": t.text} for t in facts.kernel_cmdlines]
        out["grub_commands"] = [{"event": t.event.number, "text": t.text} for t in facts.grub_commands]
        # Vendor EV_EFI_ACTION strings: vouched-for text, no defined meaning (a class allows them).
        out["efi_actions"] = [
            {"event": a.event.number, "pcr": a.event.pcr, "text": a.text} for a in facts.vendor_actions
        ]
        dbx = facts.keys.get("dbx")
        out["dbx_entries"] = len(dbx.signatures or ()) if dbx is not None else 0
        out["uninterpreted"] = [
            {
                "event": u.event.number if u.event else None,
                "pcr": u.pcr,
                "where": u.where(),
                "reason": u.reason,
            }
            for u in facts.uninterpreted  # each fails every rule that reads its PCR
        ]
    if events:
        out["event_list"] = [_event(ev) for ev in log.events]
    return out


def _text(doc: dict[str, Any]) -> str:
    lines = [
        f"events: {doc['events']}   banks: {', '.join(doc['banks']) or '-'}   "
        f"secure boot: {_yes_no(doc['secure_boot'])}   startup locality: {doc['startup_locality']}",
    ]
    for bank, values in doc["pcrs"].items():
        lines.append(f"{bank}:")
        lines.extend(f"  {index:>2}: {value}" for index, value in values.items())
    for key, title in (
        ("authorities", "authorities"),
        ("boot_applications", "boot applications"),
        ("kernel_cmdlines", "kernel command lines"),
        ("efi_actions", "vendor EFI action strings (a class must allow them: efi_actions)"),
        ("uninterpreted", "events without a vouched-for meaning"),
    ):
        items = doc.get(key) or []
        if items:
            lines.append(f"{title}:")
            lines.extend(f"  {_item(item)}" for item in items)
    for ev in doc.get("event_list", []):
        digests = " ".join(f"{b}:{d[:16]}" for b, d in ev["digests"].items())
        lines.append(f"  #{ev['number']:<4} PCR {ev['pcr']:<2} {ev['type']:<36} {digests}")
    return "\n".join(lines)


def _yes_no(value: bool | None) -> str:
    return "unknown" if value is None else ("on" if value else "off")


def _item(item: object) -> str:
    if not isinstance(item, dict):
        return str(item)
    if "subject" in item:
        subject = f" ({item['subject']})" if item["subject"] else ""
        return f"event {item['event']}: {item['variable']}: sha256:{item['sha256']}{subject}"
    if "digest" in item:
        return f"event {item['event']} (PCR {item['pcr']}): {item['digest']} {item['path']}"
    if "reason" in item:
        return f"{item['where'] or 'PCR ' + str(item['pcr'])}: {item['reason']}"
    return f"event {item['event']}: {item['text']}"


def run(args: argparse.Namespace) -> int:
    """``nodegate eventlog inspect`` and ``nodegate eventlog check`` (mbcheck.py)."""
    if args.eventlog_command == "check":
        return mbcheck.check(args)
    return inspect(args)


def inspect(args: argparse.Namespace) -> int:
    try:
        log = eventlog.parse(_read(args.file))
    except _Unreadable as exc:
        print(f"nodegate eventlog inspect: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except AttestationError as exc:
        kind = what_file_is(_read(args.file))  # an IMA list, a YAML dump, ...: say so instead
        print(f"nodegate eventlog inspect: {args.file}: {kind or exc} [{exc.code}]", file=sys.stderr)
        return EXIT_INVALID
    doc = describe(log, events=args.events)
    print(json.dumps(doc, indent=1) if args.output == "json" else _text(doc))
    return EXIT_OK


def learn(args: argparse.Namespace) -> int:
    known: list[bootfacts.BootFacts] = []
    for path in args.event_log:
        try:
            log = eventlog.parse(_read(path))
        except _Unreadable as exc:
            print(f"nodegate policy learn: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except AttestationError as exc:
            print(f"nodegate policy learn: {path}: {exc} [{exc.code}]", file=sys.stderr)
            return EXIT_INVALID
        if "sha256" not in log.banks:
            print(f"nodegate policy learn: {path}: the log has no sha256 digests", file=sys.stderr)
            return EXIT_INVALID
        pcrs = range(10) if args.kernel_cmdlines else range(8)
        facts = bootfacts.facts(log.events, bank="sha256", pcrs=pcrs)
        if facts.debug_mode is not None:  # one line, not a failed self-check: nothing admits it
            print(
                f"nodegate policy learn: {path}: the firmware is in UEFI debug mode "
                f"({facts.debug_mode.where()}); no class admits such a boot",
                file=sys.stderr,
            )
            return EXIT_INVALID
        known.append(facts)
    try:
        cls = measuredboot.learn(known, name=args.name, cmdlines=args.kernel_cmdlines)
    except (measuredboot.MeasuredBootPolicyError, ValueError) as exc:
        print(f"nodegate policy learn: {exc}", file=sys.stderr)
        return EXIT_USAGE
    dumped = cls.model_dump(mode="json", exclude_none=True)
    if not dumped.get("efi_actions"):
        dumped.pop("efi_actions", None)
    policy = {"measured_boot": {"classes": [dumped]}}
    refused = mbcheck.self_check(cls, args.event_log, cmdlines=args.kernel_cmdlines)
    if refused:  # the class must accept every log it was learned from, or it is not written
        print("nodegate policy learn: self-check failed: the class would refuse", file=sys.stderr)
        for line in refused:
            print(f"  {line}", file=sys.stderr)
        return EXIT_INVALID
    if getattr(args, "output", "yaml") == "json":
        print(json.dumps(policy, sort_keys=True))
        return EXIT_OK
    print(f"# learned from {len(known)} event log(s); review before use", file=sys.stdout)
    subjects = {f"sha256:{a.sha256}": a.subject for f in known for a in f.authorities if a.subject}
    text = yaml.safe_dump(policy, sort_keys=False, width=1000)
    print(mbcheck.annotated(text, cls, len(known), subjects), end="")
    return EXIT_OK
