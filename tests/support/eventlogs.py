"""Build TCG PC Client event logs for tests: swtpm has no firmware, so the tests write the log a
firmware would have written, byte for byte per the PFP specification (section 10)."""

from __future__ import annotations

import hashlib
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

ALGS = {
    "sha1": (0x0004, 20),
    "sha256": (0x000B, 32),
    "sha384": (0x000C, 48),
    "sha512": (0x000D, 64),
    "sm3_256": (0x0012, 32),
}
HASHLIB = {"sm3_256": "sm3"}  # bank name -> hashlib name where they differ
GLOBAL_VARIABLE = uuid.UUID("8be4df61-93ca-11d2-aa0d-00e098032b8c")
IMAGE_SECURITY_DATABASE = uuid.UUID("d719b2cb-3d3a-4596-a3bc-dad00e67656f")
CERT_SHA256 = uuid.UUID("c1c41626-504c-4092-aca9-41f936934328")
CERT_X509 = uuid.UUID("a5c059a1-94e4-4aa7-87b5-ab155c2bf072")

EV_NO_ACTION = 0x3
EV_SEPARATOR = 0x4
EV_POST_CODE = 0x1
EV_S_CRTM_VERSION = 0x8
EV_IPL = 0xD
EV_EFI_VARIABLE_DRIVER_CONFIG = 0x80000001
EV_EFI_VARIABLE_BOOT = 0x80000002
EV_EFI_BOOT_SERVICES_APPLICATION = 0x80000003
EV_EFI_ACTION = 0x80000007
EV_EFI_HCRTM_EVENT = 0x80000010
EV_EFI_VARIABLE_AUTHORITY = 0x800000E0


@dataclass
class Ev:
    pcr: int
    type: int
    data: bytes
    measured: bytes | None = None  # what the digest is over (default: data)
    digests: dict[str, bytes] = field(default_factory=dict)  # overrides, per bank

    def digest(self, bank: str) -> bytes:
        if bank in self.digests:
            return self.digests[bank]
        return hashlib.new(
            HASHLIB.get(bank, bank), self.data if self.measured is None else self.measured
        ).digest()


def variable_data(guid: uuid.UUID, name: str, value: bytes) -> bytes:
    encoded = name.encode("utf-16-le")
    return guid.bytes_le + struct.pack("<QQ", len(name), len(value)) + encoded + value


def secure_boot(on: bool) -> Ev:
    return Ev(
        7,
        EV_EFI_VARIABLE_DRIVER_CONFIG,
        variable_data(GLOBAL_VARIABLE, "SecureBoot", b"\x01" if on else b"\x00"),
    )


def dbx(*digests: bytes) -> Ev:
    owner = uuid.UUID(int=7).bytes_le
    body = b"".join(owner + d for d in digests)
    esl = CERT_SHA256.bytes_le + struct.pack("<III", 28 + len(body), 0, 16 + 32) + body
    return Ev(7, EV_EFI_VARIABLE_DRIVER_CONFIG, variable_data(IMAGE_SECURITY_DATABASE, "dbx", esl))


def key_database(name: str, *certs: bytes) -> Ev:
    """PK, KEK (global variables) or db (image security database) with X.509 entries; empty when
    no certificate is given (the firmware measures empty ones too)."""
    owner = uuid.UUID(int=9).bytes_le
    value = b"".join(
        CERT_X509.bytes_le + struct.pack("<III", 28 + 16 + len(c), 0, 16 + len(c)) + owner + c for c in certs
    )
    guid = IMAGE_SECURITY_DATABASE if name.startswith("db") else GLOBAL_VARIABLE
    return Ev(7, EV_EFI_VARIABLE_DRIVER_CONFIG, variable_data(guid, name, value))


def authority(cert_der: bytes) -> Ev:
    value = uuid.UUID(int=9).bytes_le + cert_der
    return Ev(7, EV_EFI_VARIABLE_AUTHORITY, variable_data(IMAGE_SECURITY_DATABASE, "db", value))


def application(image_digest_sha256: bytes, path: str = "\\EFI\\BOOT\\BOOTX64.EFI") -> Ev:
    text = (path + "\x00").encode("utf-16-le")
    node = bytes([4, 4]) + struct.pack("<H", 4 + len(text)) + text
    device_path = node + bytes([0x7F, 0xFF, 4, 0])
    data = struct.pack("<QQQQ", 0x1000, 0x2000, 0, len(device_path)) + device_path
    return Ev(
        4,
        EV_EFI_BOOT_SERVICES_APPLICATION,
        data,
        digests={
            "sha256": image_digest_sha256,
            "sha1": hashlib.sha1(image_digest_sha256, usedforsecurity=False).digest(),
        },
    )


def grub(prefix: str, text: str, pcr: int = 8) -> Ev:
    return Ev(pcr, EV_IPL, f"{prefix}: {text}".encode() + b"\x00", measured=text.encode())


def hcrtm(crtm_digest_of: bytes = b"the H-CRTM's code") -> Ev:
    """The event an H-CRTM platform logs first in PCR 0: data "HCRTM", the digest of what the
    hardware CRTM measured (TPM2_HashStart/HashEnd at locality 4)."""
    return Ev(0, EV_EFI_HCRTM_EVENT, b"HCRTM", measured=crtm_digest_of)


def separator(pcr: int) -> Ev:
    return Ev(pcr, EV_SEPARATOR, b"\x00\x00\x00\x00")


def spec_id(banks: Sequence[str]) -> bytes:
    body = b"Spec ID Event03\x00" + struct.pack("<IBBBB", 0, 0, 2, 0, 2) + struct.pack("<I", len(banks))
    for bank in banks:
        alg, size = ALGS[bank]
        body += struct.pack("<HH", alg, size)
    return body + b"\x00"


def build(
    events: Sequence[Ev],
    banks: Sequence[str] = ("sha1", "sha256"),
    *,
    locality: int | None = None,
    carried: Sequence[str] | None = None,
) -> bytes:
    """A crypto-agile log: the Spec ID event listing ``banks``, an optional StartupLocality event,
    then ``events`` with a digest for each of ``carried`` (default: every bank)."""
    sid = spec_id(banks)
    out = struct.pack("<II", 0, EV_NO_ACTION) + bytes(20) + struct.pack("<I", len(sid)) + sid
    agile = list(events)
    carried = list(banks if carried is None else carried)
    if locality is not None:
        agile.insert(
            0,
            Ev(
                0,
                EV_NO_ACTION,
                b"StartupLocality\x00" + bytes([locality]),
                digests={b: bytes(ALGS[b][1]) for b in banks},
            ),
        )
    for ev in agile:
        out += struct.pack("<III", ev.pcr, ev.type, len(carried))
        for bank in carried:
            out += struct.pack("<H", ALGS[bank][0]) + ev.digest(bank)
        out += struct.pack("<I", len(ev.data)) + ev.data
    return out


def replay(events: Sequence[Ev], bank: str, *, locality: int | None = None) -> dict[int, bytes]:
    """What a TPM holds after the firmware extended ``events`` (independent of attest/)."""
    size = ALGS[bank][1]
    pcrs: dict[int, bytes] = {}
    for ev in events:
        if ev.type == EV_NO_ACTION:
            continue
        start = bytes(size - 1) + bytes([locality]) if ev.pcr == 0 and locality is not None else bytes(size)
        pcrs[ev.pcr] = hashlib.new(
            HASHLIB.get(bank, bank), pcrs.get(ev.pcr, start) + ev.digest(bank)
        ).digest()
    return pcrs


def boot(
    *,
    secure: bool = True,
    kernel: str = "/vmlinuz-6.8 root=/dev/sda1 ro",
    shim: bytes = b"\x11" * 32,
    cert_der: bytes = b"",
) -> list[Ev]:
    """A plausible Linux boot: CRTM, Secure Boot variables, separators, (the db certificate that
    verified shim,) shim + grub + kernel. Indices: 2 SecureBoot, 3 dbx, 4-6 PK, KEK, db, 7-14 the
    separators of PCRs 0-7, then (15: the authority,) shim, grub, grub's linux command, the kernel
    command line and the kernel."""
    events = [
        Ev(0, EV_S_CRTM_VERSION, "1.0".encode("utf-16-le") + b"\x00\x00"),
        Ev(0, EV_POST_CODE, b"firmware", measured=b"firmware volume bytes"),
        secure_boot(secure),
        dbx(b"\xaa" * 32, b"\xbb" * 32),
        key_database("PK"),
        key_database("KEK"),
        key_database("db", *([cert_der] if cert_der else [])),
        *(separator(pcr) for pcr in range(8)),
        application(shim, "\\EFI\\ubuntu\\shimx64.efi"),
        application(b"\x22" * 32, "\\EFI\\ubuntu\\grubx64.efi"),
        grub("grub_cmd", "linux /vmlinuz-6.8 root=/dev/sda1 ro"),
        grub("kernel_cmdline", kernel),
        application(b"\x33" * 32, "\\vmlinuz-6.8"),
    ]
    if cert_der:
        events.insert(15, authority(cert_der))
    return events


def build_sha1(events: Sequence[Ev], *, locality: int | None = None) -> bytes:
    """A SHA-1-only log (TCG_PCClientPCREvent records throughout), as older firmware writes."""
    out = b""
    records = list(events)
    if locality is not None:
        records.insert(
            0, Ev(0, EV_NO_ACTION, b"StartupLocality\x00" + bytes([locality]), digests={"sha1": bytes(20)})
        )
    for ev in records:
        out += (
            struct.pack("<II", ev.pcr, ev.type)
            + ev.digest("sha1")
            + struct.pack("<I", len(ev.data))
            + ev.data
        )
    return out


def old_shim_authority(cert_der: bytes) -> Ev:
    """An authority event as shim before 8a27a48 logged it: one byte more than it measured, and
    a VariableDataLength that leaves out the signature owner (seen in real Debian and COS logs)."""
    value = cert_der + b"\x00" * 5
    encoded = "Shim".encode("utf-16-le")
    data = uuid.UUID("605dab50-e046-4300-abb6-3dd810dd8b23").bytes_le
    data += struct.pack("<QQ", 4, len(cert_der)) + encoded + value
    return Ev(7, EV_EFI_VARIABLE_AUTHORITY, data + b"\xaf", measured=data)


# The names of quirky()'s logs, for a parametrize list that must not build them at import.
QUIRKY_SHAPES = (
    "agile-sha1-sha256",
    "agile-three-banks",
    "startup-locality-3",
    "sha1-only",
    "sha1-only-locality",
    "old-shim-authority",
    "no-action-pcr-ffffffff",
    "secure-boot-off",
    "secure-boot-empty",
    "fewer-digests-than-banks",
    "unknown-event-type",
)


def quirky(cert_der: bytes) -> dict[str, bytes]:
    """Synthetic logs with the shapes real firmware produces (each written to spec from what
    public logs show): what the parser must accept."""
    base = boot(cert_der=cert_der)
    no_action_ff = Ev(
        0xFFFFFFFF, EV_NO_ACTION, b"M60\x00" + bytes(12), digests={"sha1": bytes(20), "sha256": bytes(32)}
    )
    logs = {
        "agile-sha1-sha256": build(base),
        "agile-three-banks": build(base, banks=("sha1", "sha256", "sha384")),
        "startup-locality-3": build(base, locality=3),
        "sha1-only": build_sha1(base),
        "sha1-only-locality": build_sha1(base, locality=3),
        "old-shim-authority": build([*base, old_shim_authority(cert_der)]),
        "no-action-pcr-ffffffff": build([*base[:4], no_action_ff, *base[4:]]),
        "secure-boot-off": build(boot(secure=False)),
        "secure-boot-empty": build(
            [
                *boot()[:2],
                Ev(7, EV_EFI_VARIABLE_DRIVER_CONFIG, variable_data(GLOBAL_VARIABLE, "SecureBoot", b"")),
                *boot()[3:],
            ]
        ),
        "fewer-digests-than-banks": build(
            base, banks=("sha1", "sha256", "sha384", "sha512"), carried=("sha1", "sha256")
        ),
        "unknown-event-type": build([*base, Ev(5, 0x800000FF, b"vendor", measured=b"vendor")]),
    }
    assert tuple(logs) == QUIRKY_SHAPES
    return logs


def load_option(description: str, path: str = "\\EFI\\BOOT\\BOOTX64.EFI") -> bytes:
    """EFI_LOAD_OPTION: attributes, the device path's length, a description, the device path."""
    text = (path + "\x00").encode("utf-16-le")
    device_path = bytes([4, 4]) + struct.pack("<H", 4 + len(text)) + text + bytes([0x7F, 0xFF, 4, 0])
    label = (description + "\x00").encode("utf-16-le")
    return struct.pack("<IH", 1, len(device_path)) + label + device_path


def fleet_boot(seed: int, cert_der: bytes = b"") -> list[Ev]:
    """A log the size of a real server's (about 120 events, a dbx of 300 hashes, option ROMs,
    grub's commands): for the benchmark, where size and mix matter more than the details."""

    def h(*parts: object) -> bytes:
        return hashlib.sha256(repr((seed, *parts)).encode()).digest()

    events = boot(
        cert_der=cert_der, shim=h("shim"), kernel=f"/vmlinuz-6.8.{seed} root=UUID={h('root').hex()[:32]} ro"
    )
    events[3] = dbx(*(h("dbx", i) for i in range(300)))
    extra = [Ev(0, EV_POST_CODE, f"volume {i}".encode(), measured=h("fv", i)) for i in range(12)]
    roms = [application(h("rom", i), f"\\PciRoot(0x0)\\Pci(0x{i:x},0x0)\\rom") for i in range(24)]
    extra += [Ev(2, 0x80000004, rom.data, digests=rom.digests) for rom in roms]
    extra += [
        Ev(1, EV_EFI_VARIABLE_BOOT, variable_data(GLOBAL_VARIABLE, f"Boot{i:04X}", load_option(f"entry {i}")))
        for i in range(8)
    ]
    extra += [grub("grub_cmd", f"set var{i}={h('grub', i).hex()[:16]}") for i in range(60)]
    return [*events[:4], *extra[:44], *events[4:], *extra[44:]]
