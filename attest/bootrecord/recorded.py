"""A boot record's measured-boot facts as the ``BootFacts`` the policy judges. Pure.

``attest.measuredboot.policy.evaluate`` reads, of a log's facts: the events without a vouched-for
meaning per PCR, the vendor action strings, UEFI debug mode, the SecureBoot value, the
authorities (digest, subject, variable), the dbx's image digests, the boot applications in
order, PCR 8's command lines and grub's image-starting commands, and PCR 4's applications and
actions in order. The record keeps exactly those, each with the event that showed it, so the
facts rebuilt here are judged by the same function the join ran, and name the same events. What
the record leaves out is what the policy never reads (a boot application's device path appears
only in a message, so a what-if's message for it lacks the path).
"""

from __future__ import annotations

import struct
import uuid
from typing import Final

from attest.bootrecord.model import EventRef, MeasuredBootFacts
from attest.measuredboot import efi
from attest.measuredboot.events import (
    Action,
    Application,
    Authority,
    GrubText,
    Typed,
    Uninterpreted,
    VendorAction,
)
from attest.measuredboot.facts import BootFacts, KeyVariable, Text
from attest.measuredboot.tcglog import Event

__all__ = ["DbxContentMismatch", "dbx_value", "facts_of"]

_NO_IMAGE: Final = efi.ImageLoad(0, 0, 0, b"")  # the device path is not kept (not vouched for)
_OWNER: Final = uuid.UUID(int=0).bytes_le


class DbxContentMismatch(ValueError):
    """The stored dbx digests do not fit the record's dbx identity (entry count)."""


class _RecordedAuthority(Authority):
    """An authority as recorded: its certificate's digest and subject, not the certificate. The
    tuple carries them after Authority's three fields (which read as before)."""

    __slots__ = ()

    def __new__(cls, event: Event, variable: str, digest: str, subject: str | None) -> _RecordedAuthority:
        return tuple.__new__(cls, (event, variable, b"", digest, subject))

    @property
    def sha256(self) -> str:
        return str(self[3])  # type: ignore[misc]  # the fourth item this class adds

    @property
    def subject(self) -> str | None:
        value = self[4]  # type: ignore[misc]
        return value if isinstance(value, str) else None


def _event(ref: EventRef) -> Event:
    number, pcr, etype = ref
    return Event(number, pcr, etype, {}, b"")


def dbx_value(digests: bytes) -> bytes:
    """One EFI_SIGNATURE_LIST of EFI_CERT_SHA256 entries: a dbx whose image digests are these."""
    size = 16 + 32
    body = b"".join(_OWNER + digests[i : i + 32] for i in range(0, len(digests), 32))
    return efi.CERT_SHA256.bytes_le + struct.pack("<III", 28 + len(body), 0, size) + body


def facts_of(mb: MeasuredBootFacts, dbx: bytes | None) -> BootFacts:
    """``BootFacts`` for the policy from a record's facts; ``dbx``: the image digests of its dbx
    (32 bytes each), None when they are not at hand (then no dbx is shown: a caller that judges
    ``dbx_required`` must have them)."""
    keys: dict[str, KeyVariable] = {}
    if mb.dbx is not None and dbx is not None:
        if len(dbx) != 32 * mb.dbx.entries:
            raise DbxContentMismatch(
                f"the stored dbx {mb.dbx.sha256[:16]} holds {len(dbx) // 32} digests, "
                f"the record says {mb.dbx.entries}"
            )
        keys["dbx"] = KeyVariable(_event(mb.dbx.event), "dbx", dbx_value(dbx))
    apps = tuple(Application(_event(a.event), a.digest, _NO_IMAGE) for a in mb.boot_applications)
    actions: list[Action] = []
    vendor: list[VendorAction] = []
    for act in mb.actions:
        if act.vendor:
            vendor.append(VendorAction(_event(act.event), act.text))
        else:
            actions.append(Action(_event(act.event), act.text))
    # PCR 4 in extend order: the log's order inside one PCR is what the replay vouched for.
    pcr4: list[Application | Action | VendorAction] = [
        *apps,
        *(a for a in actions if a.event.pcr == 4),
        *(v for v in vendor if v.event.pcr == 4),
    ]
    pcr4.sort(key=lambda t: t.event.number)
    typed: list[Typed] = list(pcr4)
    commands = tuple(
        GrubText(_event(c.event), "command", b"grub_cmd: ", c.command.encode(), c.command.encode())
        for c in mb.loader_commands
    )
    return BootFacts(
        bank=mb.bank,
        secure_boot=mb.secure_boot,
        secure_boot_event=_event(mb.secure_boot_event) if mb.secure_boot_event is not None else None,
        keys=keys,
        authorities=tuple(
            _RecordedAuthority(_event(a.event), a.variable, a.sha256, a.subject) for a in mb.authorities
        ),
        boot_applications=apps,
        grub_commands=commands,
        kernel_cmdlines=tuple(Text(_event(c.event), c.text) for c in mb.cmdlines),
        separators=(),
        uninterpreted=tuple(
            Uninterpreted(_event(u.event) if u.event is not None else None, u.pcr, u.reason)
            for u in mb.uninterpreted
        ),
        debug_mode=_event(mb.debug_mode) if mb.debug_mode is not None else None,
        typed=tuple(typed),
        vendor_actions=tuple(vendor),
    )
