"""The vendor EK root store (``ek_roots: [vendors]``): TPM manufacturers' root CAs, taken from
Debian's ``ruby-tpm-key-attestation`` package, never committed here (docs/ek-roots.md).

The package ships each vendor's root CA certificates under its gem's ``lib/tpm/certificates/``.
``make image`` copies that folder out of the ``.deb`` into the image (:data:`IMAGE_STORE`); on a
Debian host with the package installed, ``vendors`` reads the package's own folder. What is
committed is :data:`FILES`: each file's name and the SHA-256 of its bytes (facts). A file whose
bytes differ is refused (reported by name, never used), and so is a file the table does not list.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "ruby-tpm-key-attestation"
VERSION = "0.11.0-1"  # Debian bookworm; the table below is this version's files
GEM = "tpm-key_attestation-0.11.0"
# Inside the package (and so on a host where it is installed): the gem's certificate folder.
PACKAGE_DIR = f"usr/share/rubygems-integration/all/gems/{GEM}/lib/tpm/certificates"
# Where `make image` puts that folder in the image (scripts/image/build.py).
IMAGE_STORE = Path("/usr/share/nodegate/ek-roots")
STORE_ENV = "NODEGATE_EK_VENDOR_STORE"  # points `vendors` at another copy of the folder
MAX_FILE_BYTES = 64 * 1024  # each file is one certificate of under 2 KiB

# Why the package's Microsoft root is not a vendor root: it is the root of Microsoft's AIK
# certificate service (Windows TPM key attestation, WebAuthn "tpm" statements, the gem's own use),
# which certifies attestation keys after Microsoft's own EK check; it is not a TPM maker's EK CA.
WINDOWS_AIK_ROOT = (
    "Microsoft TPM Root Certificate Authority 2014 is the root of Windows AIK certificates, "
    "not a TPM maker's EK CA"
)


@dataclass(frozen=True, slots=True)
class VendorFile:
    file: str  # path inside the package's certificate folder
    vendor: str
    sha256: str  # of the file's bytes as the package ships them
    left_out: str = ""  # why `vendors` does not use it (empty: used)


FILES: tuple[VendorFile, ...] = (
    VendorFile(
        "AMD/RootCA/AMD-fTPM-ECC-RootCA.crt",
        "amd",
        "c2cb57bf723c174f166c5aa1dc64160981054bee18c70eb1debfc1518afa92d2",
    ),
    VendorFile(
        "AMD/RootCA/AMD-fTPM-RSA-RootCA.crt",
        "amd",
        "b73f14dea3bdaa0be87440de3fc718c771f2cbf8b7b2231c6ea228d3b20860ef",
    ),
    VendorFile(
        "Atmel/RootCA/Atmel TPM Root Signing Module.der",
        "atmel",
        "3784884ec83a8d7edbfb928ac878dc75c11451381c6a0cb27aaffb3171e0d33f",
    ),
    VendorFile(
        "Infineon/RootCA/IFX TPM EK Root CA.cer",
        "infineon",
        "7df2c3751c03ce003e99174d9cb2559f57a1b05b1920dd30bb6f8dfcf17f5e62",
    ),
    VendorFile(
        "Infineon/RootCA/IFX-RootCA.cer",
        "infineon",
        "967bb3d4544ea2740fce338077e1f5a9ea3085667246e6b968294aa045a57549",
    ),
    VendorFile(
        "Infineon/RootCA/Infineon OPTIGA(TM) ECC Root CA.crt",
        "infineon",
        "cfeb02fecd55ad7a73c6e1d11985d4c47dee248ab63dcb66091a2489660443c3",
    ),
    VendorFile(
        "Infineon/RootCA/Infineon OPTIGA(TM) RSA Root CA.crt",
        "infineon",
        "899e35474c9807eb4c7f2f7a12da0028fb250cd02154d0009fca7d9c66574f3b",
    ),
    VendorFile(
        "Intel/RootCA/EKRootPublicKey.cer",
        "intel",
        "2e1b3ba79af56d758be51697621bc4b9e8cee0983db3e749c55eb9b37c6d2ae0",
    ),
    VendorFile(
        "Microsoft/RootCA/Microsoft TPM Root Certificate Authority 2014.cer",
        "microsoft",
        "870c7a35ceab3d59979f2c6a524042d404cb71518004350925fb2ced79a999da",
        left_out=WINDOWS_AIK_ROOT,
    ),
    VendorFile(
        "NationZ/RootCA/EkRootCA.crt",
        "nationz",
        "6e931d5a10a0c1f6036ff689fe72c3c68be0a2db632caf3de14a77591e46cf83",
    ),
    VendorFile(
        "Nuvoton/RootCA/NTC TPM EK Root CA 01.cer",
        "nuvoton",
        "56b67007f448bd5c5746299fcdea9323971bbdaaefd8e3b9b84773abc888c90e",
    ),
    VendorFile(
        "Nuvoton/RootCA/NTC TPM EK Root CA 02.cer",
        "nuvoton",
        "8fac94b462b37acb84431bdc71395585caf518c17f656051ff9c4347a4726ed9",
    ),
    VendorFile(
        "Nuvoton/RootCA/NTC TPM EK Root CA ARSUF 01.cer",
        "nuvoton",
        "9e0434093fd0d4f8b927af1f4f6cffbd75f0584af4ade939bbd6851227fa4263",
    ),
    VendorFile(
        "Nuvoton/RootCA/Nuvoton TPM Root CA 1013.cer",
        "nuvoton",
        "38f8c5012d1b1321e833376611612b5b1cde466574cabc67fd2262e3b8da2f6d",
    ),
    VendorFile(
        "Nuvoton/RootCA/Nuvoton TPM Root CA 1014.cer",
        "nuvoton",
        "ad392726a92f62e5b7b112460c4e89f9fcbd523d08f39dcb928210ce8d4f676f",
    ),
    VendorFile(
        "Nuvoton/RootCA/Nuvoton TPM Root CA 1110.cer",
        "nuvoton",
        "2782e51a95e86d9557fe4204316cf805bd6f5898f81f9732e944d742bcdc5f54",
    ),
    VendorFile(
        "Nuvoton/RootCA/Nuvoton TPM Root CA 1111.cer",
        "nuvoton",
        "e38c280f7c0e0b49f31efc7531032bb6a86c3fba4eb89beb1d510eaa4510ae4a",
    ),
    VendorFile(
        "Nuvoton/RootCA/Nuvoton TPM Root CA 2010.cer",
        "nuvoton",
        "970b1cb098896f0d31be45dd299ed31f1640689f7c1618d7370cd71b6eb97560",
    ),
    VendorFile(
        "Nuvoton/RootCA/Nuvoton TPM Root CA 2011.cer",
        "nuvoton",
        "ab6005053c48534c46f54d2afbbd300a99f7b0e3ab1786034cb0785ca081a7ba",
    ),
    VendorFile(
        "Nuvoton/RootCA/Nuvoton TPM Root CA 2110.cer",
        "nuvoton",
        "4aebe77a51ed29959a7f9f5e07a24a558dee8167f3985d724995a541c258dfda",
    ),
    VendorFile(
        "Nuvoton/RootCA/Nuvoton TPM Root CA 2111.cer",
        "nuvoton",
        "cd8185ff8995ed09811970090a8c36fafab34ef87f47fa51fdb9ecf95c9c2e04",
    ),
    VendorFile(
        "STMicro/RootCA/GlobalSign Trusted Computing CA.crt",
        "stmicro",
        "f27bf02c6e00c73d915eeb6a6a2f5fbf0c31ae0393149e6b5c31e41b113841c3",
    ),
    VendorFile(
        "STMicro/RootCA/GlobalSign Trusted Platform Module ECC Root CA.crt",
        "stmicro",
        "5a8c7b5eb888cfce9322068e80e82b28b554ffeb7fdc9638dcb3763077401d26",
    ),
    VendorFile(
        "STMicro/RootCA/ST TPM Root Certificate.crt",
        "stmicro",
        "f8e37a86b689a20a6cc0c40cc3f81fb130fa9f44ce7ffa60d62590aaf87273a9",
    ),
    VendorFile(
        "STMicro/RootCA/STM TPM ECC Root CA 01.crt",
        "stmicro",
        "c541d7e5b9e3f935621acbd403896225ec641036c9ae3b5f7ac793a606ff9b79",
    ),
)


def by_name() -> dict[str, VendorFile]:
    return {f.file: f for f in FILES}


def candidates() -> list[Path]:
    """Where ``vendors`` looks, in order: $NODEGATE_EK_VENDOR_STORE, the image's folder, the
    installed package's folder (``/`` + :data:`PACKAGE_DIR`)."""
    configured = os.environ.get(STORE_ENV)
    if configured:
        return [Path(configured)]
    return [IMAGE_STORE, Path("/") / PACKAGE_DIR]


def find_store() -> Path | None:
    """The first candidate folder that holds at least one listed file, or None."""
    for folder in candidates():
        if any((folder / f.file).is_file() for f in FILES):
            return folder
    return None


def check_file(folder: Path, entry: VendorFile) -> bytes:
    """The file's bytes when they are the ones the table lists; ValueError saying why not."""
    path = folder / entry.file
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise ValueError(
            f"SHA-256 {digest} differs from {PACKAGE} {VERSION}'s ({entry.sha256}): refused; "
            "check it with scripts/refresh-ek-roots.py"
        )
    return data


def unlisted(folder: Path) -> list[Path]:
    """Files in the folder that the table does not list (refused: nothing unknown is trusted)."""
    known = {f.file for f in FILES}
    out = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            path = Path(root) / name
            if not name.startswith(".") and path.relative_to(folder).as_posix() not in known:
                out.append(path)
    return out
