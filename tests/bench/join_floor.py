"""The join benchmark's floor (``tests.bench.join``): the public-key steps of one join called
in-process back to back (no HTTP, no store), per step, and verify_ek's cost with the server's
allowlist."""

from __future__ import annotations

import datetime as dt
import gc
import os
import time
from dataclasses import dataclass

from attest import ca, svid, tpm
from attest.csr import parse_node_csr
from bootstrap.service.join.flow import EkTrust
from tests.bench.join_load import Prepared
from tests.bench.join_servers import ALLOWLIST, CHAIN, SELECTION

OPS = ("verify_ek", "verify_ak", "parse_node_csr", "make_credential", "verify_quote", "issue_svid")


@dataclass(frozen=True)
class FloorInput:
    ek_public: bytes
    ek_certificate: bytes | None
    allowlist: frozenset[str]
    ak_public: bytes
    csr_pem: str
    node_name: str
    quote: bytes
    signature: bytes
    pcrs: dict[str, dict[int, bytes]]
    qualifying_data: bytes
    spiffe_id: svid.SpiffeId


def floor_inputs(nodes: list[Prepared], variant: str) -> list[FloorInput]:
    out: list[FloorInput] = []
    for p in nodes:
        soft = p.node.tpm
        qualifying = os.urandom(32)
        quote, signature, pcrs = soft.quote(SELECTION, qualifying)
        out.append(
            FloorInput(
                ek_public=soft.ek_public,
                ek_certificate=p.node.ek_certificate if variant == CHAIN else None,
                allowlist=frozenset({soft.ek_sha256}) if variant == ALLOWLIST else frozenset(),
                ak_public=soft.ak_public,
                csr_pem=p.node.csr_pem.decode(),
                node_name=p.node.name,
                quote=quote,
                signature=signature,
                pcrs=pcrs,
                qualifying_data=qualifying,
                spiffe_id=svid.parse_spiffe_id(p.spiffe_id),
            )
        )
    return out


def floor_batch(inputs: list[FloorInput], joins: int, trust: EkTrust, signer: ca.Authority) -> list[float]:
    """Mean ns per join of each public-key step (in OPS order) over ``joins`` back-to-back joins."""
    totals = [0] * len(OPS)
    clock = time.perf_counter_ns
    now = dt.datetime.now(dt.UTC)
    ttl = dt.timedelta(hours=1)
    roots, intermediates = trust.roots, trust.intermediates
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(joins):
            f = inputs[i % len(inputs)]
            tpm.clear_caches()  # a node the service has never seen
            t0 = clock()
            tpm.verify_ek(
                f.ek_public,
                f.ek_certificate,
                roots=roots,
                intermediates=intermediates,
                allowlist=f.allowlist,
                now=now,
            )
            t1 = clock()
            ak = tpm.verify_ak(f.ak_public)
            t2 = clock()
            csr = parse_node_csr(f.csr_pem, f.node_name)
            t3 = clock()
            tpm.make_credential(f.ek_public, ak.name, os.urandom(32))
            t4 = clock()
            tpm.verify_quote(
                f.ak_public,
                f.quote,
                f.signature,
                selection=SELECTION,
                pcrs=f.pcrs,
                qualifying_data=f.qualifying_data,
            )
            t5 = clock()
            svid.issue_svid(signer, spiffe_id=f.spiffe_id, public_key=csr.public_key, now=now, ttl=ttl)
            t6 = clock()
            for k, (a, b) in enumerate(((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5), (t5, t6))):
                totals[k] += b - a
    finally:
        if gc_was_enabled:
            gc.enable()
    return [t / joins for t in totals]


def allowlist_cost(f: FloorInput, allowlist: frozenset[str], calls: int = 50) -> dict[str, float]:
    """verify_ek (allowlisted, EK cached) with the server's allowlist vs a one-entry one, µs."""
    out: dict[str, float] = {}
    allowlist = allowlist | f.allowlist  # the floor's node is not one the server admits
    for label, entries in (("server_allowlist_us", allowlist), ("one_entry_us", f.allowlist)):
        tpm.verify_ek(f.ek_public, None, roots=(), allowlist=entries)
        started = time.perf_counter_ns()
        for _ in range(calls):
            tpm.verify_ek(f.ek_public, None, roots=(), allowlist=entries)
        out[label] = (time.perf_counter_ns() - started) / calls / 1000
    out["entries"] = len(allowlist)
    return out
