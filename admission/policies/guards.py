"""nodegate's rules on a package CR that hold under every PackagePolicy: its pods may tolerate
neither every taint nor nodegate's hold taint for a reason other than the two its mutating webhook
adds itself (``packages-pending``, ``validation-failed``).

A package pod that tolerated ``nodegate.io/hold`` with ``operator: Exists`` (or every taint)
would run as root on nodes held ``unattested`` or ``quarantined``: machines whose attestation is
missing, revoked or expired. NodeWright does not look at tolerations; these rules are nodegate's
(rules "toleration-wildcard", "hold-toleration").
"""

from __future__ import annotations

from admission.hold.holdtolerations import PACKAGE_HOLD_VALUES
from admission.reading.crs import CrView, PackageCR
from admission.reading.structural import as_view
from admission.violations import Violation

# The hold reasons under which package pods are meant to run (the mutating webhook adds Equal
# tolerations for exactly these).
PACKAGE_REASONS = frozenset(PACKAGE_HOLD_VALUES)


def guard_violations(cr: PackageCR | CrView, hold_taint_key: str) -> list[Violation]:
    out: list[Violation] = []
    for i, (key, operator, value, _effect) in enumerate(as_view(cr).tolerations):
        where = f"spec.additionalTolerations[{i}]"
        if not key and operator == "Exists":
            out.append(
                Violation(
                    "toleration-wildcard",
                    where,
                    "operator Exists without a key tolerates every taint (quarantined and unattested "
                    "nodes too)",
                    "name the taint key to tolerate",
                )
            )
        elif (
            key == hold_taint_key and not (operator in (None, "", "Equal") and value in PACKAGE_REASONS)
        ) or (not key and operator in (None, "", "Equal") and value not in PACKAGE_REASONS):
            # An empty key with Equal tolerates every taint with that value (ToleratesTaint), so
            # value "unattested" without a key would reach held machines (the API server refuses
            # such a toleration in a pod anyway: without a key the operator must be Exists).
            out.append(
                Violation(
                    "hold-toleration",
                    where,
                    f"tolerates the {hold_taint_key} taint beyond packages-pending and validation-failed "
                    "(unattested or quarantined nodes)",
                    f"remove it: nodegate adds the {hold_taint_key} tolerations package pods need",
                )
            )
    return out
