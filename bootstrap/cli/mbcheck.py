"""One event log against a measured_boot policy, offline, judged by the service's own code
(``bootstrap.service.join.evidence.judge_event_log``): ``nodegate eventlog check`` and the self-check
of ``nodegate policy learn``.

    nodegate eventlog check --policy POLICY.yaml --event-log binary_bios_measurements [--pcrs PCRS.yaml]

POLICY is what ``policy learn`` prints, a nodegate config (its ``measured_boot`` key is used) or
the ``measured_boot`` mapping alone. PCRS are the values a quote covered: ``tpm2_pcrread``'s YAML
output (``sha256: {0: 0x3D45..., ...}``) or JSON/YAML ``{bank: {index: hex}}``; without it the log
is judged as if a quote matched it on PCRs 0-9 (its replay), and the output says so.

Exit codes: 0 accepted, 1 refused (the code and reason are printed), 2 usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

import yaml

from attest import eventlog, wire, yamlsafe
from attest.errors import AttestationError
from attest.filekind import describe as what_file_is
from attest.measuredboot import policy as measuredboot
from bootstrap.service.join.evidence import judge_event_log

EXIT_ACCEPTED, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
_MAX_FILE = 1024 * 1024
_REPLAYED_PCRS = range(10)  # firmware (0-7), grub's command lines (8) and files (9)


class Usage(Exception):
    pass


def _read(path: Path, what: str, limit: int = _MAX_FILE) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise Usage(f"{what} {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise Usage(f"{what} {path}: larger than {limit} bytes")
    return data


def load_policy(path: Path) -> measuredboot.MeasuredBootPolicy:
    try:
        doc = yamlsafe.load(_read(path, "--policy"))
    except (yaml.YAMLError, RecursionError) as exc:
        raise Usage(f"--policy {path}: not YAML ({str(exc).splitlines()[0]})") from None
    if isinstance(doc, dict) and "measured_boot" in doc:
        doc = doc["measured_boot"]
    try:
        return measuredboot.policy_from_obj(doc)
    except (measuredboot.MeasuredBootPolicyError, ValueError) as exc:
        raise Usage(f"--policy {path}: {' '.join(str(exc).split())[:500]}") from None


def load_pcrs(path: Path) -> dict[str, dict[int, bytes]]:
    """``{bank: {index: digest}}`` from tpm2_pcrread's YAML (0x-prefixed values that YAML reads as
    integers) or from hex strings."""
    try:
        doc = yamlsafe.load(_read(path, "--pcrs"))
    except (yaml.YAMLError, RecursionError) as exc:
        raise Usage(f"--pcrs {path}: not YAML or JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise Usage(f"--pcrs {path}: expected a mapping of banks")
    out: dict[str, dict[int, bytes]] = {}
    for bank, values in doc.items():
        size = next((wire.DIGEST_SIZES[a] for a, n in wire.BANK_BY_ALG.items() if n == bank), None)
        if size is None or not isinstance(values, dict):
            raise Usage(f"--pcrs {path}: {str(bank)[:20]!r} is not a PCR bank with values")
        out[str(bank)] = {_index(path, i): _digest(path, bank, v, size) for i, v in values.items()}
    return out


def _index(path: Path, value: object) -> int:
    if isinstance(value, str) and value.isdigit():  # JSON keys are strings
        value = int(value)
    if isinstance(value, int) and 0 <= value < 24:
        return value
    raise Usage(f"--pcrs {path}: PCR index {str(value)[:10]!r} is not 0-23")


def _digest(path: Path, bank: str, value: object, size: int) -> bytes:
    try:
        if isinstance(value, int):
            return value.to_bytes(size, "big")
        if isinstance(value, str):
            raw = bytes.fromhex(value.removeprefix("0x").removeprefix("0X"))
            if len(raw) == size:
                return raw
    except (OverflowError, ValueError):
        pass
    raise Usage(f"--pcrs {path}: a {bank} value is not {size} bytes of hex")


def replayed(log: eventlog.EventLog, pcrs: Iterable[int] = _REPLAYED_PCRS) -> dict[str, dict[int, bytes]]:
    """What a quote matching the log shows for ``pcrs`` in its preferred bank."""
    bank = next((b for b in ("sha256", "sha384", "sha512", "sha1") if b in log.banks), None)
    if bank is None:
        return {}
    values = log.replay([bank])[bank]
    size = len(next(iter(values.values()))) if values else wire.DIGEST_SIZES[wire.Alg.SHA256]
    return {bank: {i: values.get(i, log.reset_value(i, size)) for i in pcrs}}


def verdict(
    policy: measuredboot.MeasuredBootPolicy, raw: bytes, quoted: dict[str, dict[int, bytes]], name: str
) -> tuple[bool, str]:
    """(accepted, the line the service's answer would carry)."""
    try:
        matched = judge_event_log(policy, raw, quoted, name)
    except AttestationError as exc:
        return False, f"refused [{exc.code}]: {exc.detail}"
    return True, f"accepted (class {matched})" if matched else "accepted (the policy enforces nothing)"


def check(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.policy)
        raw = _read(args.event_log, "--event-log", eventlog.MAX_LOG_BYTES)
        quoted = load_pcrs(args.pcrs) if args.pcrs else None
    except Usage as exc:
        print(f"nodegate eventlog check: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        log = eventlog.parse(raw)
    except AttestationError as exc:
        print(f"event log  {args.event_log}: {what_file_is(raw) or exc.detail}")
        print(f"verdict    refused [{exc.code}]")
        return EXIT_REFUSED
    print(f"event log  {args.event_log} ({len(log.events)} events; banks {', '.join(log.banks) or '-'})")
    if quoted is None:
        quoted = replayed(log)
        shown = ", ".join(f"{b} {min(v)}-{max(v)}" for b, v in quoted.items()) or "none"
        print(f"pcrs       not given: judged as if a quote matched the log ({shown})")
    else:
        print("pcrs       " + "; ".join(f"{b} {','.join(map(str, sorted(v)))}" for b, v in quoted.items()))
    ok, line = verdict(policy, raw, quoted, str(args.event_log))
    print(f"verdict    {line}")
    return EXIT_ACCEPTED if ok else EXIT_REFUSED


def self_check(cls: measuredboot.MeasuredBootClass, paths: list[Path], *, cmdlines: bool) -> list[str]:
    """Judge every input log with the class just learned, as the service would (quoted PCRs as
    the log replays them); one line per log it would refuse, naming the event."""
    policy = measuredboot.policy_from_obj({"classes": [cls.model_dump(mode="json", exclude_none=True)]})
    pcrs = range(10) if cmdlines else range(8)
    problems = []
    for path in paths:
        raw = _read(path, "--event-log", eventlog.MAX_LOG_BYTES)
        ok, line = verdict(policy, raw, replayed(eventlog.parse(raw), pcrs), str(path))
        if not ok:
            problems.append(f"{path}: {line}")
    return problems


def annotated(
    text: str, cls: measuredboot.MeasuredBootClass, logs: int, subjects: dict[str, str] | None = None
) -> str:
    """The learned YAML with a comment above each list saying what it holds and how many, so a
    reviewer need not read hundreds of dbx digests to know what they are; each authority digest
    carries its certificate's subject (shown, never matched: issue 33)."""
    notes = {
        "dbx_required": (
            f"{len(cls.dbx_required or ())} entries in the dbx of all {logs} log(s): SHA-256s of revoked "
            "boot binaries and certificates; a node whose dbx lacks one is refused (stale revocations)"
        ),
        "authorities": (
            f"{len(cls.authorities or ())} Secure Boot authorities seen (db/shim certificates, by the "
            "SHA-256 of the DER certificate; the subject beside each is for people)"
        ),
        "boot_applications": f"{len(cls.boot_applications or ())} boot applications seen (PE image SHA-256s)",
        "kernel_cmdlines": f"{len(cls.kernel_cmdlines or ())} kernel command lines seen (grub, PCR 8)",
        "kernel_cmdline_chains": (
            f"{len(cls.kernel_cmdline_chains or ())} chain(s) of boot applications (PCR 4, in order) "
            "up to the loader that measured the command line: a line counts only after one of them"
        ),
        "efi_actions": (
            f"{len(cls.efi_actions)} vendor EV_EFI_ACTION string(s) seen, not defined by the TCG "
            "profile: allowed by name; see docs/measured-boot.md for what each means"
        ),
    }
    out = []
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        key = stripped.split(":", 1)[0]
        if key in notes and line.rstrip().endswith(":"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}# {notes[key]}\n")
        entry = stripped.removeprefix("- ").strip("'\"")
        shown = subjects.get(entry) if subjects else None
        out.append(f"{line.rstrip()}  # {shown}\n" if shown else line)
    return "".join(out)
