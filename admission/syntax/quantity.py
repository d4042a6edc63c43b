"""Kubernetes resource quantities (``500m``, ``2Gi``, ``1.5``) as exact Decimals, strictly."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from functools import lru_cache

_QUANTITY = re.compile(
    r"([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def parse_quantity(value: object) -> Decimal:
    """Raise ValueError for anything that is not a Kubernetes quantity."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{value!r} is not a quantity")  # noqa: TRY004  (callers catch ValueError)
    return _parse(str(value))  # keyed by text: True/1/1.0 must not share a cache entry


@lru_cache(maxsize=1024)
def _parse(text: str) -> Decimal:
    m = _QUANTITY.fullmatch(text) if len(text) <= 64 else None
    if m is None:
        raise ValueError(f"{text!r} is not a quantity")
    number, suffix = m.group(1), m.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number) * (Decimal(10) ** int(suffix[1:]))
        return Decimal(number) * _SUFFIX[suffix]
    except (InvalidOperation, OverflowError):
        raise ValueError(f"{text!r} is not a quantity") from None
