"""EK certificates of firmware TPMs that keep none in NV (Intel PTT, AMD fTPM): fetched from the
manufacturer's service, or read from a file (``nodegate join --ek-cert-file``).

Intel and AMD publish each fTPM's EK certificate at a URL derived from the EK's RSA public key
(the rules go-attestation and tpm2-tools follow):

- Intel (TPM manufacturer ``INTC``): ``https://ekop.intel.com/ekcertservice/`` + the URL-quoted
  base64url of SHA-256(modulus || 0x010001); the service answers JSON whose ``certificate`` is the
  DER in base64url (``=`` sometimes written ``%3D``).
- AMD (``AMD``): ``https://ftpm.amd.com/pki/aia/`` + the first 16 bytes, upper-case hex, of
  SHA-256(0x00002222 || exponent as 4 bytes || modulus); the service answers DER (PEM accepted).

No rule is published for ECC EKs: those need ``--ek-cert-file`` (or the server's allowlist). The
fetch has a timeout and a size limit, and what comes back must certify this TPM's EK before it is
sent: the certificate is only what the server will judge against its ``ek_roots``, so a wrong or
tampered answer fails here with a clear message instead of at the server.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import aiohttp
import yarl
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from attest import certparse, wire
from attest.errors import MalformedInput
from attest.keys import public_key, spki_der
from bootstrap.node.errors import JoinFailed, JoinUsageError, one_line

__all__ = [
    "AMD",
    "INTEL",
    "MAX_ANSWER",
    "certificate_url",
    "fetch_certificate",
    "manufacturer_name",
    "read_certificate_file",
]

log = logging.getLogger("nodegate.join")

INTEL = 0x494E5443  # "INTC", TPM_PT_MANUFACTURER
AMD = 0x414D4400  # "AMD\0"
SERVICES = {INTEL: "https://ekop.intel.com/ekcertservice/", AMD: "https://ftpm.amd.com/pki/aia/"}
MAX_ANSWER = 64 * 1024  # an EK certificate is under 2 KiB; Intel's JSON wraps it in base64
MAX_FILE = 64 * 1024
TIMEOUT = 10.0
_PEM_BEGIN = b"-----BEGIN CERTIFICATE-----"


def manufacturer_name(value: int) -> str:
    """The four ASCII letters of TPM_PT_MANUFACTURER ("INTC", "AMD", "IFX", ...)."""
    text = value.to_bytes(4, "big").rstrip(b"\0").decode("ascii", "replace")
    return "".join(c if c.isprintable() else "?" for c in text)


def certificate_url(manufacturer: int, ek_public: bytes, service: str | None = None) -> str | None:
    """Where ``manufacturer`` publishes the certificate of this EK (a TPM2B_PUBLIC), or None when
    it publishes none or no rule is known (ECC EKs). ``service`` replaces the vendor's base URL
    (a mirror for fleets without Internet access, or a test server)."""
    if manufacturer not in SERVICES:
        return None
    key = public_key(wire.parse_public(ek_public, "EK public"))
    if not isinstance(key, rsa.RSAPublicKey):
        return None
    numbers = key.public_numbers()
    modulus = numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")
    base = service or SERVICES[manufacturer]
    if not base.endswith("/"):
        base += "/"
    if manufacturer == INTEL:
        # Intel hashes the modulus and the default exponent, whatever the key's exponent field says.
        digest = hashlib.sha256(modulus + b"\x01\x00\x01").digest()
        return base + quote(base64.urlsafe_b64encode(digest).decode("ascii"), safe="")
    digest = hashlib.sha256(b"\x00\x00\x22\x22" + numbers.e.to_bytes(4, "big") + modulus).digest()
    return base + digest[:16].hex().upper()


def _certificate_from_answer(body: bytes) -> bytes:
    """The DER in a vendor answer: Intel's JSON, PEM, or DER. Raises ValueError."""
    text = body.lstrip()
    if text.startswith(b"{"):
        doc = json.loads(body)
        value = doc.get("certificate") if isinstance(doc, dict) else None
        if not isinstance(value, str) or not value:
            raise ValueError("a JSON answer without a certificate")
        value = unquote(value).strip()
        try:
            return base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("the certificate in the JSON answer is not base64url") from None
    if text.startswith(_PEM_BEGIN):
        blocks = list(certparse.pem_blocks(text))
        if not blocks:
            raise ValueError("PEM without a CERTIFICATE block")
        return blocks[0]
    return body


def _checked(der: bytes, ek_public: bytes, where: str) -> bytes:
    """The certificate's exact DER if ``der`` is one certificate for this EK's key (read as the
    server reads EK certificates, vendor quirks included); JoinFailed otherwise."""
    try:
        cert = certparse.read_certificate(der, "EK certificate", trailing=certparse.FILE_WHITESPACE)
    except MalformedInput as exc:
        raise JoinFailed("ek_certificate_invalid", f"{where}: {exc.detail}") from None
    key = public_key(wire.parse_public(ek_public, "EK public"))
    if not isinstance(cert.key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey) or spki_der(
        cert.key
    ) != spki_der(key):
        raise JoinFailed(
            "ek_certificate_invalid", f"{where}: the certificate is for another key than this TPM's EK"
        )
    return cert.der


async def fetch_certificate(
    manufacturer: int, ek_public: bytes, *, service: str | None = None, timeout: float = TIMEOUT
) -> bytes | None:
    """The EK certificate from the manufacturer's service, checked to certify this EK; None when
    the manufacturer publishes none for this EK. JoinFailed ``ek_certificate_unavailable`` when
    the service cannot be reached or answers something unusable."""
    url = certificate_url(manufacturer, ek_public, service)
    if url is None:
        return None
    if urlsplit(url).scheme not in ("https", "http"):
        raise JoinUsageError(f"--ek-cert-service {one_line(service, 80)} is not an http(s) URL")
    log.info(
        "fetching the EK certificate from %s", url, extra={"manufacturer": manufacturer_name(manufacturer)}
    )
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s,
            # encoded=True: sent exactly as the vendor documents it (Intel's "%3D" stays quoted)
            s.get(yarl.URL(url, encoded=True), headers={"Accept": "application/json, */*"}) as resp,
        ):
            body = await resp.content.read(MAX_ANSWER + 1)
            status = resp.status
    except TimeoutError:
        raise JoinFailed("ek_certificate_unavailable", f"{url}: no answer within {timeout:g} s") from None
    except aiohttp.ClientError as exc:
        raise JoinFailed("ek_certificate_unavailable", f"{url}: {exc}") from None
    if status != 200:
        why = "no certificate for this EK" if status == 404 else f"HTTP {status}"
        raise JoinFailed("ek_certificate_unavailable", f"{url}: {why}; use --ek-cert-file for this TPM")
    if len(body) > MAX_ANSWER:
        raise JoinFailed("ek_certificate_unavailable", f"{url}: the answer is larger than {MAX_ANSWER} bytes")
    try:
        der = _certificate_from_answer(body)
    except ValueError as exc:
        raise JoinFailed("ek_certificate_unavailable", f"{url}: {exc}") from None
    return _checked(der, ek_public, url)


def read_certificate_file(path: Path, ek_public: bytes) -> bytes:
    """An EK certificate from a file (DER or PEM), checked to certify this EK."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE + 1)
    except OSError as exc:
        raise JoinUsageError(f"--ek-cert-file {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE:
        raise JoinUsageError(f"--ek-cert-file {path}: larger than {MAX_FILE} bytes")
    try:
        der = _certificate_from_answer(raw)
    except ValueError as exc:
        raise JoinUsageError(f"--ek-cert-file {path}: {exc}") from None
    return _checked(der, ek_public, f"--ek-cert-file {path}")
