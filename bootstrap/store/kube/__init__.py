"""The shared store: node records in NodeAttestation objects, shared by every replica through etcd.

``objects`` reads and writes the objects (spec, status, ``nodegate.io/`` annotations), ``claims``
holds the EK claim Leases, ``store`` is :class:`KubeStore`, the operations.
"""

from __future__ import annotations

from bootstrap.store.kube.claims import CLAIM_LABEL, CLAIM_PREFIX, CLAIM_STALE
from bootstrap.store.kube.objects import (
    ANN_AK,
    ANN_ATTESTED,
    ANN_AUDIT,
    ANN_BOOT_ID,
    ANN_BOOT_RECORD,
    ANN_COUNTERS,
    ANN_EXPIRES,
    ANN_MEASURED_BOOT_CLASS,
    ANN_SERIALS,
    ANN_SESSIONS,
    GROUP,
    KIND,
    LABEL_EK,
    MAX_ANNOTATION,
    MAX_AUDIT,
    PLURAL,
    VERSION,
    parse,
)
from bootstrap.store.kube.store import ATTEMPTS, KubeStore

__all__ = [
    "ANN_AK",
    "ANN_ATTESTED",
    "ANN_AUDIT",
    "ANN_BOOT_ID",
    "ANN_BOOT_RECORD",
    "ANN_COUNTERS",
    "ANN_EXPIRES",
    "ANN_MEASURED_BOOT_CLASS",
    "ANN_SERIALS",
    "ANN_SESSIONS",
    "ATTEMPTS",
    "CLAIM_LABEL",
    "CLAIM_PREFIX",
    "CLAIM_STALE",
    "GROUP",
    "KIND",
    "LABEL_EK",
    "MAX_ANNOTATION",
    "MAX_AUDIT",
    "PLURAL",
    "VERSION",
    "KubeStore",
    "parse",
]
