"""The fleet's vocabulary over boot records: ``--where FIELD=VALUE`` selectors and boot groups,
one for every command that selects nodes (``kubectl nodegate boots``, ``nodegate nodes list``,
``nodegate nodes quarantine``, ``nodegate policy whatif``). Pure.

A selector matches when any of the field's values does: a digest field matches by prefix (at least
4 hex digits; ``sha256:`` is optional), a text field exactly or as a shell glob (``*``, ``?``), a
yes/no field by ``true``/``false``. Several selectors must all match.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from attest.bootrecord.model import BootRecord

__all__ = [
    "FIELDS",
    "BootGroup",
    "FieldSpec",
    "Selector",
    "SelectorError",
    "group_key",
    "grouped",
    "metric_groups",
    "metric_key",
    "matches",
    "parse_where",
    "values",
]

Kind = Literal["digest", "text", "bool"]
MIN_PREFIX: Final = 4
SHORT: Final = 12  # how many hex digits a table shows of a digest
_HEX: Final = re.compile(r"[0-9a-f]+")
_PCR_FIELD: Final = re.compile(r"pcr([0-9]|1[0-9]|2[0-3])")


class SelectorError(ValueError):
    """A ``--where`` that cannot be used; the message names the known fields."""


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str
    kind: Kind
    help: str
    read: Callable[[BootRecord, Mapping[str, str]], tuple[str, ...]]


def _one(value: str | None) -> tuple[str, ...]:
    return () if value is None else (value,)


def _bool(value: bool | None) -> tuple[str, ...]:
    return () if value is None else ("true" if value else "false")  # type: ignore[return-value]


def _of(
    part: Callable[[BootRecord], object | None], read: Callable[..., tuple[str, ...]]
) -> Callable[[BootRecord, Mapping[str, str]], tuple[str, ...]]:
    """A field read from one part of the record (nothing when the record lacks that part)."""

    def field(rec: BootRecord, _extra: Mapping[str, str]) -> tuple[str, ...]:
        found = part(rec)
        return () if found is None else read(found)

    return field


def _mb(read: Callable[..., tuple[str, ...]]) -> Callable[[BootRecord, Mapping[str, str]], tuple[str, ...]]:
    return _of(lambda r: r.measured_boot, read)


def _ek(read: Callable[..., str | None]) -> Callable[[BootRecord, Mapping[str, str]], tuple[str, ...]]:
    return _of(lambda r: r.ek, lambda e: _one(read(e)))


def _firmware(rec: BootRecord) -> str | None:
    """PCR 0 of the quoted bank: the platform firmware's code as measured."""
    for values in rec.pcrs.values():
        if 0 in values:
            return values[0]
    return None


def _kernel(rec: BootRecord) -> str | None:
    """The last boot application PCR 4 shows: the kernel when the loader measures it (shim,
    grub and systemd-boot do); a name for people, the chain is what pins the boot."""
    mb = rec.measured_boot
    return mb.boot_applications[-1].digest if mb is not None and mb.boot_applications else None


_FIELD_LIST: Final[tuple[FieldSpec, ...]] = (
    FieldSpec("node", "text", "node name", lambda r, x: _one(x.get("node"))),
    FieldSpec("pcr-class", "text", "the pcr_policy class that matched", lambda r, x: _one(r.pcr_class)),
    FieldSpec(
        "mb-class", "text", "the measured_boot class that matched", _mb(lambda m: _one(m.matched_class))
    ),
    FieldSpec("secure-boot", "bool", "Secure Boot as PCR 7 shows it", _mb(lambda m: _bool(m.secure_boot))),
    FieldSpec("firmware", "digest", "PCR 0 (the firmware's code) as quoted", lambda r, x: _one(_firmware(r))),
    FieldSpec(
        "crtm-version", "text", "the firmware's S-CRTM version string", _mb(lambda m: _one(m.crtm_version))
    ),
    FieldSpec(
        "chain",
        "digest",
        "the boot chain id (PCR 4's applications in order)",
        _mb(lambda m: _one(m.chain_id)),
    ),
    FieldSpec(
        "app", "digest", "any boot application's digest (shim, grub, kernel...)", _mb(lambda m: m.chain)
    ),
    FieldSpec("kernel", "digest", "the last boot application (the kernel)", lambda r, x: _one(_kernel(r))),
    FieldSpec(
        "cmdline", "text", "the kernel command line, where proven", _mb(lambda m: _one(m.kernel_cmdline))
    ),
    FieldSpec(
        "authority",
        "digest",
        "any authority's certificate digest (db, shim, MOK)",
        _mb(lambda m: tuple(a.sha256 for a in m.authorities)),
    ),
    FieldSpec(
        "dbx",
        "digest",
        "the dbx identity (SHA-256 of its value)",
        _mb(lambda m: _one(m.dbx.sha256 if m.dbx else None)),
    ),
    FieldSpec(
        "dbx-entries",
        "text",
        "how many image digests the dbx holds",
        _mb(lambda m: _one(str(m.dbx.entries) if m.dbx else None)),
    ),
    FieldSpec(
        "efi-action",
        "text",
        "an EFI action string in PCR 4 or 7",
        _mb(lambda m: tuple(a.text for a in m.actions)),
    ),
    FieldSpec("ek-issuer", "text", "the EK certificate's issuer", _ek(lambda e: e.issuer)),
    FieldSpec(
        "tpm-vendor",
        "text",
        "the TPM manufacturer per the EK certificate (e.g. IFX)",
        _ek(lambda e: e.vendor),
    ),
    FieldSpec("tpm-model", "text", "the TPM model per the EK certificate", _ek(lambda e: e.model)),
    FieldSpec("tpm-version", "text", "the TPM version per the EK certificate", _ek(lambda e: e.version)),
    FieldSpec(
        "tpm-firmware",
        "text",
        "the TPM firmware version the quote states",
        lambda r, x: _one(r.tpm.firmware_version if r.tpm else None),
    ),
    FieldSpec("ek", "digest", "the EK's SHA-256", _ek(lambda e: e.sha256)),
    FieldSpec("boot-id", "text", "the attested kernel boot id", lambda r, x: _one(r.boot_id)),
    FieldSpec(
        "stale",
        "bool",
        "the node rebooted since (its Node reports another boot id)",
        lambda r, x: _one(x.get("stale")),
    ),
)
FIELDS: Final[dict[str, FieldSpec]] = {f.name: f for f in _FIELD_LIST}


def _pcr_field(index: int) -> FieldSpec:
    def read(rec: BootRecord, _extra: Mapping[str, str]) -> tuple[str, ...]:
        return tuple(v[index] for v in rec.pcrs.values() if index in v)

    return FieldSpec(f"pcr{index}", "digest", f"PCR {index} as quoted", read)


@dataclass(frozen=True, slots=True)
class Selector:
    field: FieldSpec
    value: str

    def __str__(self) -> str:
        return f"{self.field.name}={self.value}"

    def matches(self, rec: BootRecord, extra: Mapping[str, str]) -> bool:
        found = self.field.read(rec, extra)
        if self.field.kind == "digest":
            return any(v.startswith(self.value) for v in found)
        if self.field.kind == "bool":
            return self.value in found
        if any(c in self.value for c in "*?["):
            return any(fnmatch.fnmatchcase(v, self.value) for v in found)
        return self.value in found


def _known() -> str:
    return ", ".join([*FIELDS, "pcr0..pcr23"])


def parse_where(text: str) -> Selector:
    name, sep, value = text.partition("=")
    name = name.strip().lower()
    if not sep or not name:
        raise SelectorError(f"--where {text[:80]!r}: expected FIELD=VALUE (fields: {_known()})")
    spec = FIELDS.get(name)
    pcr = _PCR_FIELD.fullmatch(name)
    if spec is None and pcr is not None:
        spec = _pcr_field(int(pcr.group(1)))
    if spec is None:
        raise SelectorError(f"--where: unknown field {name[:40]!r} (fields: {_known()})")
    if spec.kind == "digest":
        value = value.strip().lower().removeprefix("sha256:")
        if len(value) < MIN_PREFIX or not _HEX.fullmatch(value):
            raise SelectorError(
                f"--where {name}=: a digest or a prefix of at least {MIN_PREFIX} hex digits, "
                f"not {value[:80]!r}"
            )
    elif spec.kind == "bool":
        value = value.strip().lower()
        if value not in ("true", "false"):
            raise SelectorError(f"--where {name}=: true or false, not {value[:20]!r}")
    elif not value:
        raise SelectorError(f"--where {name}=: a value is needed (a shell glob matches several)")
    return Selector(spec, value)


def matches(rec: BootRecord, selectors: Iterable[Selector], extra: Mapping[str, str] | None = None) -> bool:
    """``extra``: what the record does not hold (``node``: the name, ``stale``: true/false)."""
    ctx = extra or {}
    return all(s.matches(rec, ctx) for s in selectors)


def values(rec: BootRecord, name: str, extra: Mapping[str, str] | None = None) -> tuple[str, ...]:
    return FIELDS[name].read(rec, extra or {})


@dataclass(frozen=True, slots=True, order=True)
class BootGroup:
    """What makes two boots the same for a fleet view: firmware, loader chain, kernel, command
    line, dbx, classes. Digests are kept whole; tables shorten them."""

    firmware: str
    chain: str
    kernel: str
    cmdline: str
    dbx: str
    pcr_class: str
    mb_class: str

    def to_json(self) -> dict[str, str | None]:
        return {
            "firmware": self.firmware or None,
            "chain": self.chain or None,
            "kernel": self.kernel or None,
            "cmdline": self.cmdline or None,
            "dbx": self.dbx or None,
            "pcrClass": self.pcr_class or None,
            "measuredBootClass": self.mb_class or None,
        }


def group_key(rec: BootRecord) -> BootGroup:
    mb = rec.measured_boot
    dbx = ""
    if mb is not None and mb.dbx is not None:
        dbx = f"{mb.dbx.sha256}/{mb.dbx.entries}"
    return BootGroup(
        firmware=_firmware(rec) or "",
        chain=(mb.chain_id if mb is not None else None) or "",
        kernel=_kernel(rec) or "",
        cmdline=(mb.kernel_cmdline if mb is not None else None) or "",
        dbx=dbx,
        pcr_class=rec.pcr_class or "",
        mb_class=(mb.matched_class if mb is not None else None) or "",
    )


MetricKey = tuple[str, str, str, str]  # pcr class, measured-boot class, chain id, dbx
MAX_SERIES: Final = 64
OTHER: Final = "other"
NONE: Final = "none"


def metric_key(rec: BootRecord) -> MetricKey:
    """The labels of a boot in the metrics: the classes (bounded by the config), the boot chain
    id and the dbx identity (16 hex digits each)."""
    mb = rec.measured_boot
    chain = (mb.chain_id if mb is not None else None) or NONE
    dbx = mb.dbx.sha256[:16] if mb is not None and mb.dbx is not None else NONE
    mb_class = (mb.matched_class if mb is not None else None) or NONE
    return (rec.pcr_class or NONE, mb_class, chain, dbx)


def metric_groups(records: Iterable[BootRecord], limit: int = MAX_SERIES) -> dict[MetricKey, int]:
    """Nodes per boot for the metrics, at most ``limit`` chain/dbx series: the largest keep their
    labels, the rest are counted per class pair as chain and dbx ``other`` (the class pairs are
    the config's, so the series stay bounded whatever the fleet boots)."""
    counts: dict[MetricKey, int] = {}
    for rec in records:
        key = metric_key(rec)
        counts[key] = counts.get(key, 0) + 1
    if len(counts) <= limit:
        return counts
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    out = dict(ranked[: limit - 1])
    for (pcr_class, mb_class, _chain, _dbx), n in ranked[limit - 1 :]:
        key = (pcr_class, mb_class, OTHER, OTHER)
        out[key] = out.get(key, 0) + n
    return out


def grouped(named: Sequence[tuple[str, BootRecord]]) -> list[tuple[BootGroup, list[str]]]:
    """(group, node names) for every distinct boot, the largest group first."""
    out: dict[BootGroup, list[str]] = {}
    for name, rec in named:
        out.setdefault(group_key(rec), []).append(name)
    return sorted(out.items(), key=lambda kv: (-len(kv[1]), kv[0]))
