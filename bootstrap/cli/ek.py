"""``nodegate ek check``: why one EK certificate is trusted or refused, as the service would judge it.

    nodegate ek check --roots vendors /etc/nodegate/ek-roots [--allowlist HEX...] ek.der [--ek-public ek.pub]

Prints the certificate, the roots read (and every file skipped), the chain found with each link
and each tolerated encoding quirk, and the verdict with its machine code. With ``--ek-public`` the
check is the service's own (``attest.tpm.verify_ek``: template, key binding, allowlist, chain);
without it only the certificate and its chain are judged.

Exit codes: 0 trusted, 1 refused, 2 usage (bad arguments, unreadable files).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from attest import certparse, cloudek, ekcert, tpm, wire
from attest.certparse import Cert
from attest.errors import AttestationError, MalformedInput
from attest.keys import spki_der
from bootstrap.cli import ekstore
from bootstrap.cli.common import SHA256_HEX
from bootstrap.service.join import ekroots

EXIT_TRUSTED, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
_MAX_INPUT = 64 * 1024


class _Usage(Exception):
    pass


def run(args: argparse.Namespace) -> int:
    if args.ek_command == "roots":
        return ekstore.run(args)
    if args.ek_command == "hash":
        from bootstrap.cli import ekhash  # noqa: PLC0415  (the TPM stack only when asked)

        return ekhash.run(args)
    try:
        return check(args)
    except _Usage as exc:
        print(f"nodegate ek check: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _arguments(args: argparse.Namespace) -> tuple[Path, list[str], datetime]:
    cert = args.cert
    if cert is None:  # argparse gave it to the option before it (--roots A B CERT)
        last = getattr(args, "several_last", None)
        values = getattr(args, last) if last else []
        if len(values) < 2:
            raise _Usage("give the EK certificate: nodegate ek check --roots PATH... CERT")
        cert = Path(values.pop())
    allowlist = [h.lower() for h in args.allowlist]
    bad = [h for h in allowlist if not SHA256_HEX.fullmatch(h)]
    if bad:
        raise _Usage(f"--allowlist {bad[0]!r} is not a 64-character hex SHA-256")
    if args.at is None:
        return cert, allowlist, datetime.now(UTC)
    try:
        at = datetime.fromisoformat(args.at)
    except ValueError:
        raise _Usage(f"--at {args.at!r} is not an RFC 3339 time") from None
    if at.tzinfo is None:
        raise _Usage("--at needs a time zone (e.g. 2030-01-01T00:00:00Z)")
    return cert, allowlist, at


def _read(path: Path, what: str) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_INPUT + 1)
    except OSError as exc:
        raise _Usage(f"{what} {path}: {exc.strerror}") from None
    if len(data) > _MAX_INPUT:
        raise _Usage(f"{what} {path}: larger than {_MAX_INPUT} bytes")
    return data


def check(args: argparse.Namespace) -> int:
    cert_path, allowlist, now = _arguments(args)
    raw = _read(cert_path, "certificate")
    try:
        evidence, form = _evidence(raw)
    except _Usage as exc:
        raise _Usage(f"{cert_path}: {exc}") from None
    ek_public = _ek_public(args.ek_public) if args.ek_public else None
    # no --roots: the vendors' store, as `ek roots` and the chart's ek_roots default
    roots = ekroots.load_roots(args.roots or [Path(ekroots.VENDORS)])
    out: list[str] = []
    leaf = _describe_leaf(out, cert_path, evidence, form)
    _describe_roots(out, roots)
    if ek_public is not None:
        code, verdict = _full(out, evidence, ek_public, roots, allowlist, now, _cloud(args))
    else:
        code, verdict = _chain_only(out, leaf, roots, allowlist, now, _cloud(args))
    out.append(f"verdict      {verdict}")
    if getattr(args, "output", "text") == "json":
        print(json.dumps(check_json(cert_path, code, verdict, out), sort_keys=True))
    else:
        print("\n".join(out))
    return code


def _cloud(args: argparse.Namespace) -> cloudek.CloudBindings:
    """``--gce-project``: the ek_cloud.gce.projects binding a GCE vTPM's chain is judged with."""
    return cloudek.CloudBindings(gce_projects=frozenset(getattr(args, "gce_project", None) or ()))


def check_json(cert: Path, code: int, verdict: str, lines: list[str]) -> dict[str, object]:
    """``-o json``: the verdict as fields (``code``: the machine code of a refusal), and the
    text report's lines."""
    refused = re.search(r"\[([a-z_]+)\]", verdict) if code != EXIT_TRUSTED else None
    how = re.search(r"\((.+)\)\Z", verdict) if code == EXIT_TRUSTED else None
    return {
        "certificate": str(cert),
        "trusted": code == EXIT_TRUSTED,
        "code": refused.group(1) if refused else None,
        "trusted_by": how.group(1) if how else None,
        "report": lines,
    }


def _evidence(raw: bytes) -> tuple[bytes, str]:
    """What a node would send: the DER (as read from NV, padding and all), from DER or PEM."""
    if not certparse.is_pem(raw):
        if raw[:1] != b"\x30":  # not a DER SEQUENCE: a wrong file, not a refused certificate
            raise _Usage("the file is neither a PEM nor a DER certificate")
        return raw, f"DER, {len(raw)} bytes"
    blocks = list(certparse.pem_blocks(raw))
    if not blocks:
        raise _Usage("a PEM file without a CERTIFICATE block")
    more = f"; the first of {len(blocks)} certificates" if len(blocks) > 1 else ""
    return blocks[0], f"PEM, {len(blocks[0])} bytes of DER{more}"


def _ek_public(path: Path) -> bytes:
    """A TPM2B_PUBLIC; a bare TPMT_PUBLIC (as some tools and test data have it) gets its size."""
    data = _read(path, "EK public")
    for candidate in (data, len(data).to_bytes(2, "big") + data):
        try:
            wire.parse_public(candidate, "EK public")
        except MalformedInput:
            continue
        return candidate
    return data  # the verdict says why it is not one


def _describe_leaf(out: list[str], path: Path, evidence: bytes, form: str) -> Cert | None:
    out.append(f"certificate  {path} ({form})")
    try:
        leaf = certparse.read_certificate(evidence)
    except MalformedInput as exc:
        out.append(f"  unreadable   {exc.detail} [{exc.code}]")
        return None
    view = leaf.view
    out += [
        f"  subject    {view.subject.rfc4514_string() or '<empty subject>'}",
        f"  issuer     {view.issuer.rfc4514_string()}",
        f"  serial     {view.serial_number:x}",
        f"  valid      {view.not_valid_before_utc.isoformat()} .. {view.not_valid_after_utc.isoformat()}",
        f"  key        {_key(leaf)}",
        f"  sha256     {leaf.sha256}",
    ]
    _quirks(out, leaf, "  ")
    return leaf


def _key(cert: Cert) -> str:
    key = cert.key
    if isinstance(key, rsa.RSAPublicKey):
        kind = f"RSA-{key.key_size}"
    elif isinstance(key, ec.EllipticCurvePublicKey):
        kind = f"ECC {key.curve.name}"
    else:
        return type(key).__name__
    return f"{kind}; EK SPKI sha256 {hashlib.sha256(spki_der(key)).hexdigest()} (the allowlist entry)"


def _quirks(out: list[str], cert: Cert, indent: str) -> None:
    for quirk in cert.quirks:
        out.append(f"{indent}quirk      {quirk}: {certparse.QUIRKS[quirk]}")


def _describe_roots(out: list[str], roots: ekroots.Roots) -> None:
    out.append(
        f"roots        {len(roots.anchors)} anchors, {len(roots.intermediates)} intermediates, "
        f"{len(roots.skipped)} files skipped"
    )
    out += [f"  skipped    {path}: {why}" for path, why in roots.skipped]


def _chain(out: list[str], chain: tuple[Cert, ...] | list[Cert], roots: ekroots.Roots) -> None:
    out.append("chain")
    for i, link in enumerate(chain):
        role = "EK certificate" if i == 0 else ("anchor" if i == len(chain) - 1 else "intermediate")
        signer = f"signed by [{i + 1}]" if i + 1 < len(chain) else "trusted as configured"
        origin = roots.origins.get(link.sha256)
        out.append(f"  [{i}] {role:<14} {link.name()}")
        out.append(
            f"      {_algorithm(link)}, {signer}; valid to "
            f"{link.view.not_valid_after_utc.date()}; sha256 {link.sha256[:16]}"
            + (f"; from {origin}" if origin else "")
        )
        _quirks(out, link, "      ")


def _algorithm(cert: Cert) -> str:
    try:
        params = cert.view.signature_algorithm_parameters
        digest = cert.view.signature_hash_algorithm
    except (UnsupportedAlgorithm, ValueError):
        return f"signature algorithm {cert.view.signature_algorithm_oid.dotted_string}"
    if isinstance(params, padding.PSS):
        kind = "RSA-PSS"
    elif isinstance(params, padding.PKCS1v15):
        kind = "RSA"
    else:
        kind = "ECDSA" if isinstance(params, ec.ECDSA) else "?"
    return f"{kind} with {digest.name if digest else '?'}"


def _refused(out: list[str], exc: AttestationError) -> tuple[int, str]:
    parts = exc.detail.split("; ")
    out.append("why")
    out += [f"  - {part}" for part in parts]
    return EXIT_REFUSED, f"refused [{exc.code}]"


def _full(
    out: list[str],
    evidence: bytes,
    ek_public: bytes,
    roots: ekroots.Roots,
    allowlist: list[str],
    now: datetime,
    cloud: cloudek.CloudBindings,
) -> tuple[int, str]:
    try:
        ident = tpm.verify_ek(
            ek_public,
            evidence,
            roots=roots.anchors,
            intermediates=roots.intermediates,
            allowlist=frozenset(allowlist),
            now=now,
            cloud=cloud,
        )
    except AttestationError as exc:
        return _refused(out, exc)
    binds = "; the certificate certifies this key" if ident.certificate is not None else ""
    out.append(f"EK public    {ident.template}, EK SPKI sha256 {ident.sha256}{binds}")
    if ident.links:
        _chain(out, ident.links, roots)
    return EXIT_TRUSTED, f"trusted ({ident.trusted_by})"


def _chain_only(
    out: list[str],
    leaf: Cert | None,
    roots: ekroots.Roots,
    allowlist: list[str],
    now: datetime,
    cloud: cloudek.CloudBindings,
) -> tuple[int, str]:
    out.append("EK public    not given: the certificate's key is not compared with a TPM's EK")
    if leaf is None:
        return EXIT_REFUSED, "refused [malformed_request]"
    key = leaf.key
    if isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):  # noqa: SIM102
        if hashlib.sha256(spki_der(key)).hexdigest() in allowlist:
            return EXIT_TRUSTED, "trusted (allowlist)"
    try:
        chain = ekcert.verify_chain(leaf, roots.anchors, roots.intermediates, now)
        cloudek.check_binding(chain, cloud)  # as the service judges a cloud vTPM's chain
    except AttestationError as exc:
        return _refused(out, exc)
    _chain(out, chain, roots)
    return EXIT_TRUSTED, f"trusted (chain:{chain[-1].name()})"
