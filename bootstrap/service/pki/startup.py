"""What must hold before ``nodegate serve`` listens, and how a failure reads.

The CA and the store belong together: the store binds nodes to the SVIDs the CA issued, and the
nodes trust only that CA's bundle. Starting on one without the other forks trust silently (every
node then fails TLS verification, or rejoins unchecked), so:

- the CA missing (``ca/index.json``) while the store holds nodes: refused, unless ``--new-ca``;
- a CA that shares no certificate with the ones the store's SVIDs were issued under: refused,
  unless ``--new-ca``;
- the sqlite file missing where a store was (``store.id`` next to it): refused; restore the file
  or remove ``store.id`` to start with an empty store on purpose.

Every failure to start is one line (``StartupError``) naming the file and the fix (the CLI prints
it and exits 2); docs/troubleshooting.md lists them.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import itertools
import logging
import ssl
import time
from datetime import datetime
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives import serialization

from attest import ca
from bootstrap.config import Settings
from bootstrap.files import create_exclusive
from bootstrap.kube import KubeUnavailable
from bootstrap.service.pki.authority import CaStore, CaUnavailable
from bootstrap.store import Store, StoreSchemaError, StoreUnavailable
from bootstrap.times import rfc3339

log = logging.getLogger("nodegate.server")

STORE_MARKER: Final = "store.id"
SQLITE_FILE: Final = "nodegate.db"
_RESTORE = "restore it from a backup (nodegate restore, docs/backup.md)"
_MAX_LINE = 600


class StartupError(ValueError):
    """The service cannot start; the message is one line that names the file and the fix."""


def anchors_of(cas: ca.CaSet) -> frozenset[str]:
    return frozenset(
        hashlib.sha256(a.certificate.public_bytes(serialization.Encoding.DER)).hexdigest()
        for a in cas.authorities
    )


def check_sqlite_present(state_dir: Path) -> None:
    """The sqlite file must not vanish from under a store: ``store.id`` says one was here."""
    marker, db = state_dir / STORE_MARKER, state_dir / SQLITE_FILE
    if marker.exists() and not db.exists():
        raise StartupError(
            f"{db} is missing, but {marker} says this state_dir held a store: its nodes would join "
            f"again unchecked (name bindings and TPM counters lost); {_RESTORE}, or remove {marker} "
            "to start with an empty store on purpose"
        )


def mark_sqlite_store(state_dir: Path, now: datetime) -> None:
    marker = state_dir / STORE_MARKER
    if not marker.exists():
        text = f"sqlite store {SQLITE_FILE} since {rfc3339(now)}; if {SQLITE_FILE} goes missing, {_RESTORE}\n"
        create_exclusive(marker, text.encode())


# A real API server answers 429 "storage is (re)initializing" for a while after a CRD is installed
# (the chart's crds/ go in right before the Deployment); kmock never did. So the store gets a
# short while to answer before the start is refused.
STORE_WAIT: float = 30.0
_STORE_BACKOFF: Final = (0.25, 0.5, 1.0, 2.0, 4.0)


async def _holds_nodes(store: Store, what: str) -> bool:
    deadline = time.monotonic() + STORE_WAIT
    for attempt in itertools.count():
        try:
            return await store.has_nodes()
        except StoreUnavailable as exc:
            pause = _STORE_BACKOFF[min(attempt, len(_STORE_BACKOFF) - 1)]
            if time.monotonic() + pause > deadline:
                raise StartupError(
                    f"store: {exc}; cannot tell whether {what}; retry once the store answers"
                ) from None
            log.warning("the store does not answer yet; waiting", extra={"error": str(exc)[:300]})
            await asyncio.sleep(pause)
    raise AssertionError("unreachable")  # itertools.count() never ends


async def load_ca(cas_store: CaStore, store: Store, *, new_ca: bool, now: datetime) -> ca.CaSet:
    """The CA, created only when that cannot fork trust (or with ``new_ca``), and checked against
    the certificates the store's SVIDs were issued under."""
    index = cas_store.index
    if not index.exists():
        if not new_ca and await _holds_nodes(store, "nodes depend on the missing CA"):
            raise StartupError(
                f"{index} is missing but the store holds nodes whose SVIDs and bundles come from that "
                f"CA: restore {cas_store.folder} from a backup (nodegate restore, docs/backup.md), or "
                "start with --new-ca to issue a new CA on purpose (every node must then join again "
                "with the new bundle)"
            )
        if new_ca:
            log.warning("starting a new CA on purpose (--new-ca)", extra={"error": str(cas_store.folder)})
    cas = cas_store.load_or_create(now)
    cas_store.check_key_modes(cas)
    current = anchors_of(cas)
    try:
        known = await store.trust_anchors()
    except StoreUnavailable as exc:
        log.warning("cannot compare the CA with the store's", extra={"error": str(exc)[:300]})
        return cas
    if known and not known & current and not new_ca and await _holds_nodes(store, "the CA changed"):
        raise StartupError(
            f"the CA in {cas_store.folder} did not issue the store's SVIDs (none of its {len(current)} "
            f"certificates is among the {len(known)} the store knows): restore the CA that belongs to this "
            "store (nodegate restore, docs/backup.md), or start with --new-ca to trust this CA on purpose "
            "(every node must then join again with its bundle)"
        )
    await remember(store, cas)
    return cas


async def remember(store: Store, cas: ca.CaSet) -> None:
    """Record the CA's certificates with the store (at start and after each rotation)."""
    try:
        await store.remember_trust_anchors(anchors_of(cas))
    except StoreUnavailable as exc:
        log.warning("could not record the CA with the store", extra={"error": str(exc)[:300]})


def one_line(exc: BaseException, settings: Settings) -> str:
    """One line for a failure to start: what, which file, and the fix."""
    state = settings.state_dir
    if isinstance(exc, CaUnavailable):
        text = (
            f"{exc}; fix the file or restore {state / 'ca'} from a backup (nodegate restore, docs/backup.md)"
        )
    elif isinstance(exc, StoreSchemaError):
        text = f"store {state / SQLITE_FILE if settings.store == 'sqlite' else 'kubernetes'}: {exc}"
    elif isinstance(exc, StoreUnavailable):
        where = state / SQLITE_FILE if settings.store == "sqlite" else "kubernetes"
        text = f"store {where}: {exc}; if the file is damaged, {_RESTORE}"
    elif isinstance(exc, KubeUnavailable):
        text = f"kubernetes: {exc}; check kubernetes.kubeconfig and that the API server answers"
    elif isinstance(exc, ssl.SSLError):
        text = f"TLS certificate or key ({settings.tls.cert_file or state / 'tls'}): {exc}; fix the pair"
    elif isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        text = (
            f"listen {settings.listen}: the port is already in use (another nodegate?); "
            "stop it or change listen"
        )
    elif isinstance(exc, OSError):
        where = exc.filename if exc.filename is not None else state
        text = (
            f"{where}: {exc.strerror or exc}; check that the file exists and nodegate may read and write it"
        )
    elif isinstance(exc, ValueError):
        text = str(exc)
    else:
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:_MAX_LINE]
