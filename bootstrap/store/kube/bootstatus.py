"""A boot record on a NodeAttestation (issue 43, docs/fleet.md): the annotation
``nodegate.io/boot-record`` the store writes with the binding, and ``status.boot``, its published
copy, as a merge patch that replaces the whole record."""

from __future__ import annotations

from typing import Any, Final

from attest.bootrecord.model import BootRecord

__all__ = ["ANN_BOOT_RECORD", "BootRecordUnreadable", "boot_record", "boot_status"]

ANN_BOOT_RECORD: Final = "nodegate.io/boot-record"


class BootRecordUnreadable(ValueError):
    """The annotation is there but holds no boot record this nodegate reads."""


def boot_record(annotations: dict[str, Any], max_chars: int) -> BootRecord | None:
    """The record in the annotations (None: none kept); BootRecordUnreadable otherwise."""
    text = annotations.get(ANN_BOOT_RECORD)
    text = None if text == "" else text
    if text is None:
        return None
    if not isinstance(text, str) or len(text) > max_chars:
        raise BootRecordUnreadable(f"annotation {ANN_BOOT_RECORD} is not text")
    try:
        return BootRecord.model_validate_json(text)
    except ValueError:
        raise BootRecordUnreadable(f"annotation {ANN_BOOT_RECORD} is not a boot record") from None


_BANKS: Final = ("sha1", "sha256", "sha384", "sha512", "sm3_256")


def boot_status(rec: BootRecord | None) -> dict[str, Any] | None:
    """``status.boot`` as a merge patch that replaces the whole record: every field written, an
    unset one as null (which removes it), and the PCR banks and indices the record lacks nulled
    too, so nothing of an earlier record survives in a key this one does not have."""
    if rec is None:
        return None
    out: dict[str, Any] = _lists_without_nulls(rec.model_dump(mode="json", by_alias=True), in_list=False)
    pcrs: dict[str, Any] = dict.fromkeys(_BANKS)
    for bank, values in out["pcrs"].items():
        pcrs[bank] = {**{str(i): None for i in range(24)}, **values}
    out["pcrs"] = pcrs
    return out


def _lists_without_nulls(value: Any, *, in_list: bool) -> Any:
    """A list replaces the old one whole in a merge patch, so its items carry no nulls (those
    would be stored, not removed); outside lists a null removes the key."""
    if isinstance(value, dict):
        return {
            k: _lists_without_nulls(v, in_list=in_list)
            for k, v in value.items()
            if not (in_list and v is None)
        }
    if isinstance(value, list):
        return [_lists_without_nulls(v, in_list=True) for v in value]
    return value
