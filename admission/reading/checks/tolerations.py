"""spec.additionalTolerations, read for nodegate's own rules on them (:mod:`admission.policies.guards`):
NodeWright does not check them."""

from __future__ import annotations

from typing import Any

from admission.reading.checks.values import ABSENT, NotCanonical

# key, operator, value, effect
Toleration = tuple[str | None, str | None, str | None, str | None]


def read_tolerations(value: Any) -> tuple[Toleration, ...]:
    if value is ABSENT:
        return ()
    if type(value) is not list:
        raise NotCanonical
    out = []
    for tol in value:
        if type(tol) is not dict:
            raise NotCanonical
        entry = (tol.get("key"), tol.get("operator"), tol.get("value"), tol.get("effect"))
        for v in entry:
            if v is not None and type(v) is not str:
                raise NotCanonical
        out.append(entry)
    return tuple(out)
