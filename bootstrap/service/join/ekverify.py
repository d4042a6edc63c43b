"""The EK decision of a join start, with the intermediates the configuration lacks: the ones the
node sent (``ek_chain``) and, where still no path reaches an anchor, the ones its certificates'
AIA caIssuers URLs name (bootstrap/service/join/aia.py). Both only help to build a path; the decision
itself stays ``attest.tpm.verify_ek`` over typed inputs (docs/ek-roots.md, "Intermediates")."""

from __future__ import annotations

from datetime import datetime

from attest import certparse, ekcert, tpm
from attest.certparse import Cert
from attest.errors import EkUntrusted, MalformedInput
from bootstrap.service.join.aia import AiaFetcher
from bootstrap.service.join.ekroots import EkTrust

MAX_ROUNDS = 3  # an EK chain has at most 2-3 intermediates; each round fetches the next issuers


def sent_intermediates(chain: tuple[bytes, ...]) -> list[Cert]:
    """The node's intermediates that read as certificates (one that does not is malformed input)."""
    out = []
    for i, der in enumerate(chain):
        out.append(certparse.read_certificate(der, f"ek_chain[{i}]"))
    return out


async def verify_ek(
    trust: EkTrust,
    ek_public: bytes,
    ek_certificate: bytes | None,
    *,
    sent: tuple[bytes, ...] = (),
    fetcher: AiaFetcher | None,
    now: datetime,
) -> tpm.EkIdentity:
    extra = sent_intermediates(sent)
    tried: set[str] = set()
    notes: list[str] = []
    for _ in range(MAX_ROUNDS + 1):
        try:
            return tpm.verify_ek(
                ek_public,
                ek_certificate,
                roots=trust.roots,
                intermediates=(*trust.intermediates, *extra),
                allowlist=trust.allowlist,
                denylist=trust.denylist,
                now=now,
                cloud=trust.cloud,
            )
        except EkUntrusted as exc:
            if fetcher is None or ek_certificate is None:
                raise
            try:
                leaf = certparse.read_certificate(ek_certificate)
            except MalformedInput:
                raise exc from None
            urls = [
                u
                for u in ekcert.missing_issuer_urls(leaf, trust.roots, (*trust.intermediates, *extra))
                if u not in tried
            ]
            if not urls:
                if notes:
                    raise EkUntrusted("; ".join([exc.detail, *notes])) from None
                raise
            tried.update(urls)
            got, why = await fetcher.fetch(urls)
            notes += why
            known = {c.sha256 for c in extra}
            extra += [c for c in got if c.sha256 not in known]
            if not got:
                raise EkUntrusted("; ".join([exc.detail, *notes])) from None
    raise EkUntrusted("EK certificate does not chain to a trusted root: too many intermediates to fetch")
