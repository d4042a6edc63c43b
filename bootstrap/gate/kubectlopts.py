"""``kubectl nodegate status`` as kubectl users expect it: ``--kubeconfig``/``--context``,
``-l/--selector`` (server-side), ``--reason`` to filter, ``-o wide|json|yaml`` (wide truncates
nothing and adds the message, the attestation state and the expiry), ``-w/--watch`` (a row each
time a node changes, from a watch of Nodes)."""

from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, Final

import yaml

from bootstrap.gate.cache import ATTESTATIONS
from bootstrap.kube import WatchExpired

OUTPUTS: Final = ("table", "wide", "json", "yaml")


class StatusError(Exception):
    """A one-line failure of ``kubectl nodegate`` (exit 2 unless the subclass says otherwise)."""

    code: ClassVar[str] = "status-error"
    exit_code: ClassVar[int] = 2


class NodeNotFound(StatusError):
    code: ClassVar[str] = "node-not-found"
    exit_code: ClassVar[int] = 1


class UsageError(StatusError):
    code: ClassVar[str] = "usage"


# --reason: a hold reason, or "none" for nodes the gate does not hold
REASONS: Final = ("unattested", "packages-pending", "validation-failed", "quarantined", "none")
WIDE_COLUMNS: Final = (
    "NODE",
    "HOLD",
    "PHASE",
    "REASON",
    "ATTESTATION",
    "WAITING FOR",
    "MESSAGE",
    "ATTESTED",
    "EXPIRES",
    "SPIFFE-ID",
)


def kubeconfig_path(flag: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """--kubeconfig, else the first existing file in $KUBECONFIG, else ~/.kube/config if it
    exists, else None (in-cluster). A named file that does not exist is an error later."""
    if flag:
        return flag
    env = os.environ if env is None else env
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        # kubectl merges the list; one file is enough here: take the first that exists
        return next((p for p in listed if os.path.isfile(p)), listed[0])
    home = env.get("HOME")
    default = Path(home) / ".kube" / "config" if home else Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


def age(delta: timedelta) -> str:
    """kubectl-like short ages: 45s, 7m, 5h, 3d (clock skew into the future reads 0s)."""
    s = max(int(delta.total_seconds()), 0)
    if s < 120:
        return f"{s}s"
    if s < 120 * 60:
        return f"{s // 60}m"
    if s < 48 * 3600:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def held_for(hold: str | None, reason: str | None) -> bool:
    """Whether a row with hold taint value ``hold`` passes ``--reason``."""
    if reason is None:
        return True
    return hold is None if reason == "none" else hold == reason


def _clean(text: str) -> str:
    # cluster objects are written by others: no control sequences, line breaks or bidi overrides
    return "".join(c if c == " " or unicodedata.category(c)[0] not in "CZ" else "?" for c in text)


def _time(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render_wide(rows: Sequence[object]) -> str:
    """Every column in full (no cell is cut), the attestation state and the gate's message."""
    body = []
    for r in rows:
        hold = getattr(r, "hold", None)
        body.append(
            (
                r.node,  # type: ignore[attr-defined]
                "-" if hold is None else (hold or '""'),
                r.shown_phase,  # type: ignore[attr-defined]
                getattr(r, "reason", None) or "-",
                r.attestation_state,  # type: ignore[attr-defined]
                "; ".join(r.waiting) or "-",  # type: ignore[attr-defined]
                getattr(r, "message", "") or "-",
                _time(getattr(r, "attested_at", None)),
                _time(getattr(r, "expires_at", None)),
                getattr(r, "spiffe_id", None) or "-",
            )
        )
    cells = [WIDE_COLUMNS, *(tuple(_clean(str(c)) for c in line) for line in body)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(WIDE_COLUMNS))]
    return (
        "\n".join(
            "   ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
        )
        + "\n"
    )


def render_yaml(docs: list[dict[str, object]]) -> str:
    # through JSON first: only plain types, and control characters escaped as the JSON output does
    return str(yaml.safe_dump(json.loads(json.dumps(docs)), sort_keys=False))


async def follow(
    kube: Any,
    resource_version: str,
    args: Any,
    row_of: Callable[..., Any],
    render: Callable[[list[Any]], str],
    write: Callable[[str], None],
    *,
    streams: int | None = None,
) -> None:
    """``--watch``: after the list, one row (no header) each time a node changes, from a watch
    of Nodes (restarted when the server ends it; relisted on 410 Gone). ``streams``: stop after
    that many watch streams ended (tests); None: until interrupted."""
    rv, ended = resource_version, 0
    while streams is None or ended < streams:
        try:
            async for event in kube.watch_nodes(rv, label_selector=args.selector):
                meta = event.object.get("metadata") or {}
                rv = str(meta.get("resourceVersion") or rv)
                if event.type not in ("ADDED", "MODIFIED") or not meta.get("name"):
                    continue
                if args.node is not None and meta["name"] != args.node:
                    continue
                att = await kube.get_cluster_object(*ATTESTATIONS, meta["name"])
                row = row_of(event.object, att, now=datetime.now(UTC))
                if held_for(row.hold, args.reason):
                    text = render([row])
                    write(text if args.output in ("json", "yaml") else text.split("\n", 1)[1])
        except WatchExpired:
            _, rv = await kube.list_nodes(label_selector=args.selector)
            continue
        ended += 1
