"""``kubectl nodegate boots [NODE] [--where FIELD=VALUE]... [-o table|wide|json|yaml]``: what booted
where, from the boot records the join service keeps in NodeAttestations (docs/fleet.md).

Nodes are grouped by boot (firmware, boot chain, kernel, proven command line, dbx, classes) with
counts; ``-o wide`` lists each group's nodes and whole digests; ``-o json`` gives the groups and
every node's record (what ``nodegate policy whatif --records`` reads, with the dbx digests this
user may read). A node whose Node reports another boot than its record (rebooted, not attested
since) is counted as stale, and shown so; what the Node itself reports (its kernel version and
OS image) is shown beside the record, marked as not vouched for. Only reads.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import yaml

from attest.bootrecord import fleet
from attest.bootrecord.model import BootRecord
from bootstrap.gate import holds
from bootstrap.gate.cache import ATTESTATIONS
from bootstrap.gate.kubectlopts import NodeNotFound, StatusError, UsageError
from bootstrap.kube import Kube, KubeUnavailable, NotServed
from bootstrap.store.kube.dbx import DbxLeases
from bootstrap.store.kube.objects import ANN_BOOT_RECORD, field

__all__ = ["BootRow", "Boots", "read_boots", "render_groups", "render_json", "render_node", "render_wide"]

SHORT: Final = fleet.SHORT
GROUP_COLUMNS: Final = (
    "NODES",
    "STALE",
    "FIRMWARE",
    "CHAIN",
    "KERNEL",
    "CMDLINE",
    "DBX",
    "PCR-CLASS",
    "MB-CLASS",
)


@dataclass(frozen=True, slots=True)
class BootRow:
    node: str
    record: BootRecord | None
    problem: str | None  # why there is no record (none kept yet, unreadable)
    node_boot_id: str | None  # what the Node reports now
    has_node: bool
    reported: dict[str, str]  # the Node's own words: kernelVersion, osImage (not vouched for)

    @property
    def stale(self) -> bool:
        """The machine booted again since its record (the Node reports another boot id)."""
        if self.record is None or not self.has_node or self.node_boot_id is None:
            return False
        return self.record.boot_id != self.node_boot_id

    @property
    def extra(self) -> dict[str, str]:
        return {"node": self.node, "stale": "true" if self.stale else "false"}

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "stale": self.stale,
            "nodeBootID": self.node_boot_id,
            "record": self.record.to_obj() if self.record is not None else None,
            "problem": self.problem,
            "reportedByNode": self.reported or None,
        }


@dataclass(frozen=True, slots=True)
class Boots:
    rows: tuple[BootRow, ...]
    dbx: dict[str, bytes]  # dbx identity -> image digests, where the Leases could be read

    @property
    def with_records(self) -> list[tuple[str, BootRecord]]:
        return [(r.node, r.record) for r in self.rows if r.record is not None]


def record_of(obj: Mapping[str, Any]) -> tuple[BootRecord | None, str | None]:
    """The boot record of a NodeAttestation: the store's annotation (what it wrote with the
    binding), else the published status.boot."""
    text = field(field(obj, "metadata"), "annotations").get(ANN_BOOT_RECORD)
    boot = field(obj, "status").get("boot")
    if isinstance(text, str) and text:
        try:
            return BootRecord.model_validate_json(text), None
        except ValueError:
            return None, f"annotation {ANN_BOOT_RECORD} is not a boot record"
    if isinstance(boot, dict):
        try:
            return BootRecord.model_validate(boot), None
        except ValueError:
            return None, "status.boot is not a boot record"
    if field(obj, "spec").get("ekSha256") in (None, ""):
        return None, "forgotten (no binding)"
    return None, "no boot record yet (attested before boot records were kept)"


def _reported(node: Mapping[str, Any] | None) -> dict[str, str]:
    info = field(field(node, "status"), "nodeInfo")
    return {k: str(info[k])[:256] for k in ("kernelVersion", "osImage") if isinstance(info.get(k), str)}


async def read_boots(kube: Kube, node: str | None = None, *, namespace: str = "nodegate") -> Boots:
    """Every NodeAttestation's record with its Node (or one node's). NotServed when the CRD is
    not installed; the dbx digests only where the Leases can be read (they need rights in
    nodegate's namespace that a viewer may lack)."""
    if node is not None:
        att = await kube.get_cluster_object(*ATTESTATIONS, node)
        atts = [att] if att is not None else []
        got = await kube.get_node(node)
        nodes = {node: got} if got is not None else {}
    else:
        atts, _ = await kube.list_cluster_objects(*ATTESTATIONS)
        listed, _ = await kube.list_nodes()
        nodes = {str(field(n, "metadata").get("name", "")): n for n in listed}
    rows = []
    for att in atts:
        name = str(field(att, "metadata").get("name", ""))
        record, problem = record_of(att)
        n = nodes.get(name)
        rows.append(
            BootRow(
                node=name,
                record=record,
                problem=problem,
                node_boot_id=holds.node_boot_id(n) if n is not None else None,
                has_node=n is not None,
                reported=_reported(n),
            )
        )
    ids = _dbx_ids(rows)
    dbx: dict[str, bytes] = {}
    if ids:
        try:
            dbx = await DbxLeases(kube, namespace=namespace).read(ids)
        except (KubeUnavailable, NotServed):
            dbx = {}  # not this user's to read: the records stand without them
    return Boots(tuple(sorted(rows, key=lambda r: r.node)), dbx)


def select(boots: Boots, selectors: Sequence[fleet.Selector]) -> Boots:
    if not selectors:
        return boots
    keep = tuple(
        r for r in boots.rows if r.record is not None and fleet.matches(r.record, selectors, r.extra)
    )
    return Boots(keep, {k: v for k, v in boots.dbx.items() if k in _dbx_ids(keep)})


def _dbx_ids(rows: Sequence[BootRow]) -> set[str]:
    return {
        r.record.measured_boot.dbx.sha256
        for r in rows
        if r.record is not None
        and r.record.measured_boot is not None
        and r.record.measured_boot.dbx is not None
    }


# -- rendering ---------------------------------------------------------------------------------


def _short(value: str, n: int = SHORT) -> str:
    return value[:n] if value else "-"


def _clean(text: str) -> str:
    return "".join(c if c == " " or unicodedata.category(c)[0] not in "CZ" else "?" for c in text)


def _cap(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    cells = [tuple(header), *(tuple(_clean(c) for c in r) for r in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return (
        "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)
        + "\n"
    )


def _groups(boots: Boots) -> list[tuple[fleet.BootGroup, list[str], int]]:
    stale = {r.node for r in boots.rows if r.stale}
    return [(g, names, sum(1 for n in names if n in stale)) for g, names in fleet.grouped(boots.with_records)]


def _dbx_cell(dbx: str, whole: bool) -> str:
    if not dbx:
        return "-"
    digest, _, entries = dbx.partition("/")
    return f"{digest if whole else digest[:SHORT]}/{entries}"


def render_groups(boots: Boots) -> str:
    rows = [
        (
            str(len(names)),
            str(stale),
            _short(g.firmware),
            g.chain or "-",
            _short(g.kernel),
            _cap(g.cmdline, 48) if g.cmdline else "-",
            _dbx_cell(g.dbx, whole=False),
            g.pcr_class or "-",
            g.mb_class or "-",
        )
        for g, names, stale in _groups(boots)
    ]
    out = _table(GROUP_COLUMNS, rows) if rows else "no boot records\n"
    missing = [r for r in boots.rows if r.record is None]
    if missing:
        out += f"{len(missing)} node(s) without a boot record: " + ", ".join(r.node for r in missing[:20])
        out += " ..." if len(missing) > 20 else ""
        out += "\n"
    return out


def render_wide(boots: Boots) -> str:
    """Every group with its whole digests and its nodes (stale ones marked)."""
    stale = {r.node for r in boots.rows if r.stale}
    blocks = []
    for g, names, n_stale in _groups(boots):
        lines = [
            f"{len(names)} node(s), {n_stale} stale",
            f"  firmware (PCR 0): {g.firmware or '-'}",
            f"  chain:            {g.chain or '-'}",
            f"  kernel:           {g.kernel or '-'}",
            f"  cmdline:          {g.cmdline or '- (not proven)'}",
            f"  dbx:              {_dbx_cell(g.dbx, whole=True)}",
            f"  classes:          pcr {g.pcr_class or '-'}, measured boot {g.mb_class or '-'}",
            "  nodes:            " + ", ".join(f"{n} (stale)" if n in stale else n for n in names),
        ]
        blocks.append("\n".join(_clean(line) for line in lines))
    return "\n\n".join(blocks) + "\n" if blocks else "no boot records\n"


def render_json(boots: Boots) -> str:
    groups = [
        {**g.to_json(), "count": len(names), "stale": n_stale, "nodes": names}
        for g, names, n_stale in _groups(boots)
    ]
    doc = {
        "groups": groups,
        "nodes": [r.to_json() for r in boots.rows],
        "dbx": {k: v.hex() for k, v in sorted(boots.dbx.items())},
    }
    return json.dumps(doc, indent=2) + "\n"


def render_node(row: BootRow) -> str:
    """One node's record in full, for people."""
    lines = [f"node:            {row.node}"]
    if row.record is None:
        lines.append(f"boot record:     none ({row.problem})")
        return "\n".join(_clean(line) for line in lines) + "\n"
    rec = row.record
    state = "stale: the Node reports another boot (rebooted, not attested since)" if row.stale else "current"
    if not row.has_node:
        state = "no Node object"
    lines += [
        f"attested:        {rec.attested_at.isoformat()} ({state})",
        f"boot id:         {rec.boot_id or '-'} (Node reports {row.node_boot_id or '-'})",
        f"classes:         pcr {rec.pcr_class or '-'}, measured boot "
        + (rec.measured_boot.matched_class or "-" if rec.measured_boot else "- (no event log)"),
    ]
    for bank, values in rec.pcrs.items():
        lines += [f"pcr {bank}:{i:<2}       {v}" for i, v in values.items()]
    mb = rec.measured_boot
    if mb is not None:
        lines.append(f"secure boot:     {mb.secure_boot}")
        if mb.crtm_version:
            lines.append(f"firmware:        {mb.crtm_version} (S-CRTM version)")
        lines += [
            f"authority:       sha256:{a.sha256} {a.subject or ''} ({a.variable})" for a in mb.authorities
        ]
        if mb.dbx is not None:
            lines.append(f"dbx:             {mb.dbx.sha256} ({mb.dbx.entries} entries)")
        lines += [f"boot app {i + 1}:      {a.digest}" for i, a in enumerate(mb.boot_applications)]
        lines.append(f"kernel cmdline:  {mb.kernel_cmdline or '- (not proven)'}")
        lines += [f"PCR 8 line:      {c.text}" for c in mb.cmdlines]
        lines += [f"EFI action:      {a.text}{' (vendor)' if a.vendor else ''}" for a in mb.actions]
        lines += [f"uninterpreted:   PCR {u.pcr}: {u.reason}" for u in mb.uninterpreted]
    if rec.ek is not None:
        lines.append(f"EK:              {rec.ek.sha256} ({rec.ek.trusted_by})")
        lines.append(f"EK issuer:       {rec.ek.issuer or '-'}")
        lines.append(
            f"TPM (EK cert):   {rec.ek.vendor or rec.ek.manufacturer or '-'} "
            f"{rec.ek.model or ''} {rec.ek.version or ''}"
        )
    if rec.tpm is not None:
        lines.append(f"TPM firmware:    {rec.tpm.firmware_version} (signed in the quote)")
    for key, value in row.reported.items():
        lines.append(f"Node {key}: {value} (reported by the node, not vouched for)")
    return "\n".join(_clean(line) for line in lines) + "\n"


# -- command line ------------------------------------------------------------------------------


def selectors(args: Any) -> list[fleet.Selector]:
    """``--where`` of ``boots`` (none for ``status``); a bad one is a usage error."""
    try:
        return [fleet.parse_where(w) for w in getattr(args, "where", None) or ()]
    except fleet.SelectorError as exc:
        raise UsageError(str(exc)) from None


def add_parser(sub: Any) -> None:
    b = sub.add_parser("boots", help="what booted where: nodes grouped by attested boot")
    b.add_argument("node", nargs="?", metavar="NODE", help="one node's record in full")
    b.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="only nodes whose record matches (digests by prefix; fields: docs/fleet.md); repeatable",
    )
    b.add_argument("-o", "--output", choices=("table", "wide", "json", "yaml"), default="table")
    b.add_argument("--kubeconfig", metavar="FILE", help="default: $KUBECONFIG, ~/.kube/config, in-cluster")
    b.add_argument("--context", help="the kubeconfig context to use (default: its current-context)")
    b.add_argument("-n", "--namespace", default="nodegate", help="nodegate's namespace (dbx Leases)")


async def run(
    kube: Kube, node: str | None, selectors: Sequence[fleet.Selector], output: str, namespace: str
) -> tuple[str, str | None]:
    try:
        boots = await read_boots(kube, node, namespace=namespace)
    except NotServed:
        raise StatusError(
            "nodeattestations.nodegate.io is not served by this cluster: no boot records"
        ) from None
    if node is not None and not boots.rows:
        raise NodeNotFound(f'nodeattestation "{node}" not found')
    shown = select(boots, selectors)
    if output == "json":
        return render_json(shown), None
    if output == "yaml":
        return str(yaml.safe_dump(json.loads(render_json(shown)), sort_keys=False)), None
    if node is not None:
        return (render_node(shown.rows[0]) if shown.rows else "the node's record does not match\n"), None
    if output == "wide":
        return render_wide(shown), None
    return render_groups(shown), None
