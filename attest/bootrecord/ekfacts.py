"""What a verified EK certificate says about its TPM: issuer, and the TCG attributes (TCG EK
Credential Profile 3.2.9: tpmManufacturer, tpmModel, tpmVersion) in its subject alternative name's
directoryName, or, on certificates that put them there, in the subject. Pure."""

from __future__ import annotations

import contextlib
import string
from typing import Final

from cryptography import x509

from attest.bootrecord.model import MAX_TEXT, EkFacts
from attest.identity import EkIdentity

__all__ = ["TPM_MANUFACTURER", "TPM_MODEL", "TPM_VERSION", "ek_facts", "ek_facts_of", "vendor_text"]

TPM_MANUFACTURER: Final = x509.ObjectIdentifier("2.23.133.2.1")
TPM_MODEL: Final = x509.ObjectIdentifier("2.23.133.2.2")
TPM_VERSION: Final = x509.ObjectIdentifier("2.23.133.2.3")
_WANTED: Final = (TPM_MANUFACTURER, TPM_MODEL, TPM_VERSION)


def ek_facts(ek: EkIdentity) -> EkFacts:
    """The facts of an EK the join start verified (``attest.tpm.verify_ek``)."""
    return ek_facts_of(ek.sha256, ek.trusted_by, ek.certificate)


def ek_facts_of(sha256: str, trusted_by: str, cert: x509.Certificate | None) -> EkFacts:
    """``cert``: the EK certificate's decoded fields (a quirky one's canonical copy), or None."""
    if cert is None:
        return EkFacts(sha256=sha256, trusted_by=_clip(trusted_by) or "")
    found = _tcg_attributes(cert)
    manufacturer = found.get(TPM_MANUFACTURER)
    return EkFacts(
        sha256=sha256,
        trusted_by=_clip(trusted_by) or "",
        issuer=_clip(_issuer(cert)),
        manufacturer=_clip(manufacturer),
        vendor=vendor_text(manufacturer) if manufacturer else None,
        model=_clip(found.get(TPM_MODEL)),
        version=_clip(found.get(TPM_VERSION)),
    )


def _issuer(cert: x509.Certificate) -> str | None:
    try:
        return cert.issuer.rfc4514_string()
    except ValueError:
        return None


def _tcg_attributes(cert: x509.Certificate) -> dict[x509.ObjectIdentifier, str]:
    names: list[x509.Name] = []
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names.extend(san.get_values_for_type(x509.DirectoryName))
    except (x509.ExtensionNotFound, ValueError):
        pass  # no (readable) SAN: the subject may still carry them
    with contextlib.suppress(ValueError):  # an unreadable subject: only the SAN then
        names.append(cert.subject)
    out: dict[x509.ObjectIdentifier, str] = {}
    for name in names:
        for attr in name:
            if attr.oid in _WANTED and attr.oid not in out and isinstance(attr.value, str):
                out[attr.oid] = attr.value
    return out


def vendor_text(manufacturer: str) -> str | None:
    """``id:49465800`` -> ``IFX``: the TCG vendor id is four ASCII characters (NUL-padded)."""
    text = manufacturer.removeprefix("id:")
    if len(text) != 8:
        return None
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return None
    name = raw.rstrip(b"\x00 ").decode("ascii", "replace")
    return name if name and all(c in string.printable and c not in "\t\n\r\x0b\x0c" for c in name) else None


def _clip(value: str | None) -> str | None:
    if value is None:
        return None
    clean = "".join(c if c.isprintable() else "?" for c in value)
    return clean[:MAX_TEXT]
