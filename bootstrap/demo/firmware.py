"""The demo's stand-in for firmware: swtpm has none, so the demo measures a boot itself. Each event
is extended into the TPM's sha256 PCRs and written to a TCG crypto-agile event log, exactly as
UEFI firmware, shim and grub would (TCG PC Client PFP section 10), so `nodegate join --event-log`
sends what a real machine sends and the service replays it against the quote."""

from __future__ import annotations

import datetime
import hashlib
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bootstrap.node.tpm import Agent

EV_NO_ACTION = 0x3
EV_SEPARATOR = 0x4
EV_S_CRTM_VERSION = 0x8
EV_IPL = 0xD
EV_EFI_VARIABLE_DRIVER_CONFIG = 0x80000001
EV_EFI_BOOT_SERVICES_APPLICATION = 0x80000003
EV_EFI_VARIABLE_AUTHORITY = 0x800000E0
_GLOBAL_VARIABLE = uuid.UUID("8be4df61-93ca-11d2-aa0d-00e098032b8c")
_IMAGE_SECURITY_DATABASE = uuid.UUID("d719b2cb-3d3a-4596-a3bc-dad00e67656f")
_SHA256 = 0x000B


@dataclass(frozen=True)
class Measurement:
    pcr: int
    type: int
    data: bytes
    digest: bytes  # sha256, what is extended

    @classmethod
    def of(cls, pcr: int, etype: int, data: bytes, measured: bytes | None = None) -> Measurement:
        return cls(pcr, etype, data, hashlib.sha256(data if measured is None else measured).digest())


def _variable(guid: uuid.UUID, name: str, value: bytes) -> bytes:
    return guid.bytes_le + struct.pack("<QQ", len(name), len(value)) + name.encode("utf-16-le") + value


def _application(image_digest: bytes, path: str) -> Measurement:
    text = (path + "\x00").encode("utf-16-le")
    device_path = bytes([4, 4]) + struct.pack("<H", 4 + len(text)) + text + bytes([0x7F, 0xFF, 4, 0])
    data = struct.pack("<QQQQ", 0x1000, 0x2000, 0, len(device_path)) + device_path
    return Measurement(4, EV_EFI_BOOT_SERVICES_APPLICATION, data, image_digest)


def image_digest(name: str) -> bytes:
    """The demo's stand-in for an image's Authenticode digest."""
    return hashlib.sha256(f"demo image {name}".encode()).digest()


def db_certificate() -> tuple[str, bytes]:
    """The demo's stand-in for the Secure Boot db CA that signed shim: (RFC 4514 subject, DER)."""
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "nodegate demo UEFI CA"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nodegate demo"),
        ]
    )
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.subject.rfc4514_string(), cert.public_bytes(serialization.Encoding.DER)


def _config(guid: uuid.UUID, name: str, value: bytes = b"") -> Measurement:
    return Measurement.of(7, EV_EFI_VARIABLE_DRIVER_CONFIG, _variable(guid, name, value))


def linux_boot(
    *, secure_boot: bool, db_cert_der: bytes, kernel: str = "vmlinuz-6.8.0-demo", cmdline: str = "ro quiet"
) -> list[Measurement]:
    """A Secure Boot Linux boot: CRTM, the Secure Boot configuration (SecureBoot, PK, KEK, db,
    dbx, measured even when empty), separators, the db certificate that verified shim, then
    shim, grub, grub's linux command and the command line it gives the kernel, and the kernel."""
    owner = uuid.UUID(int=1).bytes_le
    return [
        Measurement.of(0, EV_S_CRTM_VERSION, "demo firmware 1.0".encode("utf-16-le")),
        _config(_GLOBAL_VARIABLE, "SecureBoot", b"\x01" if secure_boot else b"\x00"),
        _config(_GLOBAL_VARIABLE, "PK"),
        _config(_GLOBAL_VARIABLE, "KEK"),
        _config(_IMAGE_SECURITY_DATABASE, "db"),
        _config(_IMAGE_SECURITY_DATABASE, "dbx"),
        *(Measurement.of(pcr, EV_SEPARATOR, b"\x00\x00\x00\x00") for pcr in range(8)),
        Measurement.of(
            7, EV_EFI_VARIABLE_AUTHORITY, _variable(_IMAGE_SECURITY_DATABASE, "db", owner + db_cert_der)
        ),
        _application(image_digest("shimx64.efi"), "\\EFI\\BOOT\\BOOTX64.EFI"),
        _application(image_digest("grubx64.efi"), "\\EFI\\BOOT\\grubx64.efi"),
        Measurement.of(
            8,
            EV_IPL,
            f"grub_cmd: linux /{kernel} {cmdline}".encode() + b"\x00",
            f"linux /{kernel} {cmdline}".encode(),
        ),
        Measurement.of(
            8,
            EV_IPL,
            f"kernel_cmdline: /{kernel} {cmdline}".encode() + b"\x00",
            measured=f"/{kernel} {cmdline}".encode(),
        ),
        _application(image_digest(kernel), f"\\{kernel}"),
    ]


def _log(events: list[Measurement]) -> bytes:
    spec = b"Spec ID Event03\x00" + struct.pack("<IBBBBI", 0, 0, 2, 0, 2, 1) + struct.pack("<HH", _SHA256, 32)
    spec += b"\x00"
    out = struct.pack("<II", 0, EV_NO_ACTION) + bytes(20) + struct.pack("<I", len(spec)) + spec
    for ev in events:
        out += struct.pack("<IIIH", ev.pcr, ev.type, 1, _SHA256) + ev.digest
        out += struct.pack("<I", len(ev.data)) + ev.data
    return out


def boot(tcti: str, events: list[Measurement], log_path: Path) -> Path:
    """Measure ``events`` into the TPM at ``tcti`` and write their log to ``log_path``."""
    with Agent(tcti) as agent:
        for ev in events:
            agent.extend_pcr(ev.pcr, ev.digest, "sha256")
    log_path.write_bytes(_log(events))
    return log_path
