"""Each distinct dbx's image digests, kept once: one Lease ``nodegate-dbx-<identity>`` in
nodegate's namespace, annotation ``nodegate.io/dbx-digests`` (base64 of the 32-byte digests,
sorted). The identity is the SHA-256 of the dbx value they came from, so every writer writes the
same bytes and a Lease, once created, never changes. A fleet holds a handful of distinct dbx
values; a boot record names its dbx by identity (what-if reads the digests for dbx_required).
A Lease rather than a NodeAttestation: it belongs to no node, and nodegate already writes Leases
there (EK claims, trust anchors)."""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections.abc import Collection
from typing import Any, Final

from bootstrap.kube import Conflict, Kube
from bootstrap.store.kube.objects import field

__all__ = ["DBX_ANNOTATION", "DBX_LABEL", "DBX_PREFIX", "DbxLeases"]

DBX_PREFIX: Final = "nodegate-dbx-"
DBX_ANNOTATION: Final = "nodegate.io/dbx-digests"
DBX_LABEL: Final = "nodegate.io/kind"


def _digests(lease: dict[str, Any] | None) -> bytes | None:
    text = field(field(lease, "metadata"), "annotations").get(DBX_ANNOTATION)
    if not isinstance(text, str):
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) % 32 == 0 else None


class DbxLeases:
    def __init__(self, kube: Kube, *, namespace: str) -> None:
        self._kube = kube
        self._namespace = namespace
        self._known: set[str] = set()  # written (or found) by this process: never written again

    async def keep(self, dbx: tuple[tuple[str, bytes], ...]) -> None:
        for identity, digests in dbx:
            if identity in self._known:
                continue
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": DBX_PREFIX + identity,
                    "namespace": self._namespace,
                    "labels": {DBX_LABEL: "dbx"},
                    "annotations": {DBX_ANNOTATION: base64.b64encode(digests).decode("ascii")},
                },
                "spec": {},
            }
            with contextlib.suppress(Conflict):  # kept already: the same identity is the same bytes
                await self._kube.create_lease(self._namespace, body)
            self._known.add(identity)

    async def read(self, identities: Collection[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for identity in sorted(set(identities)):
            digests = _digests(await self._kube.get_lease(self._namespace, DBX_PREFIX + identity))
            if digests is not None:
                out[identity] = digests
        return out
