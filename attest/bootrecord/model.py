"""The boot record: what a node's last accepted attestation showed, as facts the TPM vouched for.

Bounded (every list and text has a cap, a list that hits its cap names itself in ``truncated``),
JSON in the store (sqlite column, NodeAttestation annotation and ``status.boot``) with the
camelCase names below. Nothing here is read from event data the digest does not cover: boot
applications are their Authenticode digests (never the device path the firmware logs beside
them), authorities the certificates that hash to their events, command lines and action strings
the text their digest is of. Events are named ``[number, pcr, type]`` as the join named them
(``event 12 (PCR 4, EV_EFI_BOOT_SERVICES_APPLICATION)``): the position is the log's as sent.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = [
    "MAX_ACTIONS",
    "MAX_APPLICATIONS",
    "MAX_AUTHORITIES",
    "MAX_CMDLINES",
    "MAX_CMDLINE_CHARS",
    "MAX_LOADER_COMMANDS",
    "MAX_TEXT",
    "MAX_UNINTERPRETED",
    "RECORD_VERSION",
    "Action",
    "Authority",
    "BootApplication",
    "BootRecord",
    "Cmdline",
    "DbxIdentity",
    "EkFacts",
    "EventRef",
    "LoaderCommand",
    "MeasuredBootFacts",
    "Problem",
    "TpmFacts",
]

RECORD_VERSION: Final = 1
MAX_AUTHORITIES: Final = 32
MAX_APPLICATIONS: Final = 64
MAX_CMDLINES: Final = 16
MAX_CMDLINE_CHARS: Final = 4096  # Linux's COMMAND_LINE_SIZE is 2048 on x86 and arm64
MAX_ACTIONS: Final = 64
MAX_LOADER_COMMANDS: Final = 16
MAX_UNINTERPRETED: Final = 32
MAX_TEXT: Final = 256  # subjects, reasons, EK fields

HEX64 = r"\A[0-9a-f]{64}\z"
HEX = r"\A(?:[0-9a-f]{2}){1,64}\z"
Text = Annotated[str, Field(max_length=MAX_TEXT)]


def _printable(value: str) -> str:
    if not value.isprintable():
        raise ValueError("text must be printable")
    return value


Printable = Annotated[str, Field(max_length=MAX_TEXT), AfterValidator(_printable)]


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True, strict=False
    )


# (number in the log, PCR, event type): what ``Event.where()`` names.
EventRef = tuple[
    Annotated[int, Field(ge=0, lt=1 << 32)],
    Annotated[int, Field(ge=0, le=23)],
    Annotated[int, Field(ge=0, lt=1 << 32)],
]


Bank = Annotated[str, Field(min_length=1, max_length=16, pattern=r"\A[a-z0-9_]+\z")]
PcrValues = dict[Annotated[int, Field(ge=0, le=23)], Annotated[str, Field(pattern=HEX)]]


class Authority(_Model):
    variable: Annotated[str, Field(max_length=32)]  # db, vendor_db, Shim, MokList, MokListX
    sha256: Annotated[str, Field(pattern=HEX64)]  # of the DER certificate (the raw value when none)
    subject: Printable | None = None
    event: EventRef


class BootApplication(_Model):
    digest: Annotated[str, Field(pattern=HEX)]  # in the facts' bank: the image's Authenticode hash
    event: EventRef


class Cmdline(_Model):
    text: Annotated[str, Field(max_length=MAX_CMDLINE_CHARS)]
    event: EventRef


class LoaderCommand(_Model):
    """A grub command that starts an image whose command line grub does not measure."""

    command: Annotated[str, Field(max_length=64)]
    event: EventRef


class Action(_Model):
    """An EV_EFI_ACTION / EV_ACTION string in PCRs 4 and 7 (``vendor``: one the profile does not
    define, which a class allows by name)."""

    text: Annotated[str, Field(max_length=MAX_TEXT)]
    vendor: bool = False
    event: EventRef


class Problem(_Model):
    """An event with no vouched-for meaning in a judged PCR (or what PCR 7 lacks: no event)."""

    pcr: Annotated[int, Field(ge=0, le=23)]
    reason: Text
    event: EventRef | None = None


class DbxIdentity(_Model):
    """The dbx measured before PCR 7's separator: the SHA-256 of its value and how many entries
    (image digests) it holds; the digests themselves are kept once per distinct dbx, by this id."""

    sha256: Annotated[str, Field(pattern=HEX64)]
    entries: Annotated[int, Field(ge=0)]
    event: EventRef


class MeasuredBootFacts(_Model):
    """The facts of the event log in the quoted bank, in the PCRs the quote covers."""

    bank: Annotated[str, Field(max_length=16)]
    matched_class: Annotated[str, Field(max_length=128)] | None = None
    secure_boot: bool | None = None
    secure_boot_event: EventRef | None = None
    debug_mode: EventRef | None = None
    crtm_version: Printable | None = None  # EV_S_CRTM_VERSION in PCR 0, when its digest is the text's
    authorities: tuple[Authority, ...] = Field(default=(), max_length=MAX_AUTHORITIES)
    dbx: DbxIdentity | None = None
    boot_applications: tuple[BootApplication, ...] = Field(default=(), max_length=MAX_APPLICATIONS)
    # The command line the matched class proved (kernel_cmdlines with its chain); None: unproven.
    kernel_cmdline: Annotated[str, Field(max_length=MAX_CMDLINE_CHARS)] | None = None
    cmdlines: tuple[Cmdline, ...] = Field(default=(), max_length=MAX_CMDLINES)  # PCR 8, as measured
    loader_commands: tuple[LoaderCommand, ...] = Field(default=(), max_length=MAX_LOADER_COMMANDS)
    actions: tuple[Action, ...] = Field(default=(), max_length=MAX_ACTIONS)
    uninterpreted: tuple[Problem, ...] = Field(default=(), max_length=MAX_UNINTERPRETED)
    truncated: tuple[Annotated[str, Field(max_length=32)], ...] = Field(default=(), max_length=8)

    @property
    def chain(self) -> tuple[str, ...]:
        return tuple(a.digest for a in self.boot_applications)

    @property
    def chain_id(self) -> str | None:
        """A short name for the boot chain (PCR 4's applications in order); None without any."""
        if not self.boot_applications:
            return None
        return hashlib.sha256(",".join(self.chain).encode()).hexdigest()[:16]


class EkFacts(_Model):
    """What the EK certificate states (verified: the chain was checked at the join), or only
    ``sha256`` and ``trustedBy`` for an allowlisted EK without one."""

    sha256: Annotated[str, Field(pattern=HEX64)]
    trusted_by: Printable = ""
    issuer: Printable | None = None
    manufacturer: Printable | None = None  # TCG tpmManufacturer, e.g. "id:49465800"
    vendor: Printable | None = None  # the manufacturer's TCG vendor id as text, e.g. "IFX"
    model: Printable | None = None  # TCG tpmModel, e.g. "SLB 9670 TPM2.0"
    version: Printable | None = None  # TCG tpmVersion (the firmware at manufacture), e.g. "id:0728"


class TpmFacts(_Model):
    """What the TPM itself signed in the quote: the firmware version it runs now."""

    firmware_version: Annotated[str, Field(max_length=32)]


class BootRecord(_Model):
    version: Literal[1]
    attested_at: datetime
    boot_id: Annotated[str, Field(max_length=64)] | None = None
    reset_count: Annotated[int, Field(ge=0)] | None = None
    pcrs: dict[Bank, PcrValues] = Field(max_length=8)  # the values the TPM signed, per bank
    pcr_class: Annotated[str, Field(max_length=128)] | None = None
    measured_boot: MeasuredBootFacts | None = None  # None: the node sent no event log
    ek: EkFacts | None = None
    tpm: TpmFacts | None = None

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_defaults=True)

    def to_obj(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=True)
