"""SPIFFE trust bundles: the JWK Set document a trust domain publishes, strictly parsed, and PEM.

A bundle lists the X.509 roots of one trust domain; each entry carries its certificate (``x5c``)
and the JWK parameters of its key, which must agree.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from attest.ekcert import parse_certificate_der
from attest.errors import MalformedInput
from attest.x509svid import EC_CURVES, SvidInvalid

MAX_BUNDLE_BYTES = 256 * 1024
MAX_BUNDLE_KEYS = 256


class BundleInvalid(SvidInvalid):
    """A SPIFFE bundle document that is malformed or inconsistent."""

    code = "bundle_invalid"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _uint_bytes(value: int) -> bytes:
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def _jwk_params(cert: x509.Certificate) -> dict[str, str]:
    key = cert.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey):
        curve = EC_CURVES.get(key.curve.name)
        if curve is None:
            raise ValueError(f"bundle key curve {key.curve.name} is not supported")
        crv, size = curve
        nums = key.public_numbers()
        return {
            "kty": "EC",
            "crv": crv,
            "x": _b64url(nums.x.to_bytes(size, "big")),
            "y": _b64url(nums.y.to_bytes(size, "big")),
        }
    if isinstance(key, rsa.RSAPublicKey):
        rnums = key.public_numbers()
        return {"kty": "RSA", "n": _b64url(_uint_bytes(rnums.n)), "e": _b64url(_uint_bytes(rnums.e))}
    raise ValueError("bundle keys must be EC or RSA")


def _check_uint64(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ValueError(f"{what} must be an integer in [0, 2^64)")
    return value


def bundle_document(roots: Sequence[x509.Certificate], *, sequence: int, refresh_hint: int) -> dict[str, Any]:
    """The SPIFFE bundle (a JWK Set) for X.509 roots; serialise it with ``json.dumps``."""
    keys: list[dict[str, Any]] = []
    for cert in roots:
        entry: dict[str, Any] = _jwk_params(cert)
        entry["use"] = "x509-svid"
        entry["x5c"] = [base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode("ascii")]
        keys.append(entry)
    return {
        "keys": keys,
        "spiffe_sequence": _check_uint64(sequence, "spiffe_sequence"),
        "spiffe_refresh_hint": _check_uint64(refresh_hint, "spiffe_refresh_hint"),
    }


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BundleInvalid(f"bundle has duplicate key {key!r}")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise BundleInvalid(f"bundle contains {name}, which is not JSON")


def _parse_x509_entry(index: int, entry: dict[str, Any]) -> x509.Certificate:
    where = f"bundle key {index}"
    if "kid" in entry:
        raise BundleInvalid(f"{where}: x509-svid entries must not have a kid")
    x5c = entry.get("x5c")
    if not isinstance(x5c, list) or len(x5c) != 1 or not isinstance(x5c[0], str):
        raise BundleInvalid(f"{where}: x5c must be a list of exactly one base64 certificate")
    try:
        der = base64.b64decode(x5c[0], validate=True)
    except (binascii.Error, ValueError):
        raise BundleInvalid(f"{where}: x5c[0] is not standard base64") from None
    if base64.b64encode(der).decode("ascii") != x5c[0]:
        raise BundleInvalid(f"{where}: x5c[0] is not canonical standard base64")
    try:
        cert = parse_certificate_der(der, f"{where} certificate")
        expected = _jwk_params(cert)
    except MalformedInput as exc:
        raise BundleInvalid(exc.detail) from None
    except ValueError as exc:
        raise BundleInvalid(f"{where}: {exc}") from None
    for name, value in expected.items():
        if entry.get(name) != value:
            raise BundleInvalid(f"{where}: JWK parameter {name!r} does not match the certificate's key")
    return cert


def parse_bundle_document(
    data: bytes, *, max_bytes: int = MAX_BUNDLE_BYTES
) -> tuple[list[x509.Certificate], int]:
    """Strictly parse a SPIFFE bundle: returns its X.509 roots and ``spiffe_sequence`` (0 when the
    producer left it out, which the spec permits). Entries of other ``use`` or ``kty`` are skipped."""
    if not isinstance(data, bytes | bytearray):
        raise BundleInvalid("bundle must be bytes")
    if len(data) > max_bytes:
        raise BundleInvalid(f"bundle of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        text = bytes(data).decode("utf-8")
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BundleInvalid(f"bundle is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BundleInvalid("bundle must be a JSON object")
    keys = doc.get("keys")
    if not isinstance(keys, list):
        raise BundleInvalid("bundle must have a 'keys' list")
    if len(keys) > MAX_BUNDLE_KEYS:
        raise BundleInvalid(f"bundle has more than {MAX_BUNDLE_KEYS} keys")
    try:
        sequence = _check_uint64(doc.get("spiffe_sequence", 0), "spiffe_sequence")
        if "spiffe_refresh_hint" in doc:
            _check_uint64(doc["spiffe_refresh_hint"], "spiffe_refresh_hint")
    except ValueError as exc:
        raise BundleInvalid(f"bundle {exc}") from None
    certs: list[x509.Certificate] = []
    for index, entry in enumerate(keys):
        if not isinstance(entry, dict):
            raise BundleInvalid(f"bundle key {index} is not a JSON object")
        # Spec: unknown or missing use / kty means "ignore this entry", not "reject the bundle".
        if entry.get("use") != "x509-svid" or entry.get("kty") not in ("EC", "RSA"):
            continue
        cert = _parse_x509_entry(index, entry)
        if cert not in certs:
            certs.append(cert)
    return certs, sequence


def bundle_pem(roots: Sequence[x509.Certificate]) -> bytes:
    return b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in roots)
