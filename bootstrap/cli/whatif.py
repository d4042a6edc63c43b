"""``nodegate policy whatif``: what a policy change would do before it is rolled out (docs/fleet.md).

    nodegate policy whatif --config NEW.yaml [--current CONFIG.yaml]
    nodegate policy whatif --measured-boot CLASSES.yaml --current CONFIG.yaml
    nodegate policy whatif --measured-boot CLASSES.yaml --records fleet.json
    nodegate policy whatif --policy NEW-POLICIES.yaml [--current-policy FILE]... [--objects FILE]...

Boot side: every stored boot record is judged, offline, by the new ``pcr_policy`` and
``measured_boot`` (``--config``) or the new measured_boot alone (``--measured-boot``: a config, its
``measured_boot`` key, or the mapping), through the join's own evaluation
(``attest.bootrecord.judge``), and compared with the current policies (``--current``) or, without
them, with what each record shows. Records come from ``--records`` (``kubectl nodegate boots -o
json``), else from the store the new config names, else from the current config's (sqlite: read
only; kubernetes: the NodeAttestations, with the kubeconfig).

Package side (``--policy``): every NodeWright / Skyhook CR in the cluster (or ``--objects``) is
judged by the webhook's rules under today's PackagePolicies (the cluster's, or
``--current-policy``) and the new ones; what the new ones would deny is listed with why.

Exit codes (for CI): 0 no node and no CR would newly be refused; 1 some would (listed); 3 none
would, but some records cannot tell (listed); 2 usage, config, store or cluster errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from admission.reading.policy import PackagePolicy
from attest.bootrecord import fleet
from attest.bootrecord.model import BootRecord
from attest.bootrecord.whatif import Change, Policies, compare
from bootstrap.cli.mbcheck import Usage, load_policy
from bootstrap.config import ConfigError, Settings, load_settings
from bootstrap.files import read_limited
from bootstrap.gate import kubectlboots
from bootstrap.gate.kubectlopts import kubeconfig_path
from bootstrap.kube import Kube, KubeUnavailable, NotServed
from bootstrap.service.webhook.policyload import ToolError, documents, load_policies
from bootstrap.service.webhook.policytest import audit_objects
from bootstrap.store import StoreSchemaError, StoreUnavailable
from bootstrap.store.sqlite.readonly import read_boot_records

EXIT_CLEAR, EXIT_REFUSED, EXIT_USAGE, EXIT_UNKNOWN = 0, 1, 2, 3
MAX_RECORDS_FILE: Final = 512 * 1024 * 1024  # 10,000 records are ~20 MB; a fleet of 100,000 fits
SHOWN_FINDINGS: Final = 3
PROG: Final = "nodegate policy whatif"
PACKAGE_RESOURCES: Final = (
    ("skyhook.nvidia.com", "v1alpha1", "skyhooks"),
    ("nodewright.nvidia.com", "v1alpha1", "nodewrights"),
)


class _ExportedNode(BaseModel):
    model_config = ConfigDict(extra="ignore")
    node: str = Field(max_length=253)
    stale: bool = False
    record: BootRecord | None = None


class _Export(BaseModel):
    """What ``kubectl nodegate boots -o json`` writes (the groups are not read)."""

    model_config = ConfigDict(extra="ignore")
    nodes: list[_ExportedNode]
    dbx: dict[str, str] = {}


@dataclass(frozen=True, slots=True)
class Fleet:
    records: list[tuple[str, BootRecord]]
    without: list[tuple[str, str]]  # node, why it has no record
    dbx: dict[str, bytes]
    stale: set[str]


# -- inputs ------------------------------------------------------------------------------------


def _settings(path: Path, flag: str) -> Settings:
    try:
        return load_settings(path)
    except ConfigError as exc:
        raise Usage(f"{flag} {path}: {exc}") from None


def _records_file(path: Path) -> Fleet:
    try:
        raw = read_limited(path, MAX_RECORDS_FILE)
    except OSError as exc:
        raise Usage(f"--records {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise Usage(f"--records: {exc}") from None
    try:
        doc = _Export.model_validate_json(raw)
        dbx = {k: bytes.fromhex(v) for k, v in doc.dbx.items()}
    except (ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0][:200]
        raise Usage(f"--records {path}: not what `kubectl nodegate boots -o json` writes ({first})") from None
    return Fleet(
        [(n.node, n.record) for n in doc.nodes if n.record is not None],
        [(n.node, "no boot record") for n in doc.nodes if n.record is None],
        dbx,
        {n.node for n in doc.nodes if n.stale},
    )


async def _kube(settings: Settings | None, args: argparse.Namespace) -> Kube:
    configured = str(settings.kubernetes.kubeconfig) if settings and settings.kubernetes.kubeconfig else None
    kube = await Kube.from_config(kubeconfig_path(args.kubeconfig or configured), context=args.context)
    if kube is None:
        raise Usage("no kubeconfig found and not running in a cluster; pass --kubeconfig")
    return kube


async def _store_fleet(settings: Settings, args: argparse.Namespace) -> Fleet:
    if settings.store == "sqlite":
        rows, dbx = read_boot_records(settings.state_dir / "nodegate.db")
        return Fleet(
            [(n, r) for n, r, _ in rows if r is not None],
            [(n, why or "no boot record") for n, r, why in rows if r is None],
            dbx,
            set(),
        )
    kube = await _kube(settings, args)
    try:
        boots = await kubectlboots.read_boots(kube, namespace=args.namespace)
    finally:
        await kube.close()
    return Fleet(
        [(r.node, r.record) for r in boots.rows if r.record is not None],
        [(r.node, r.problem or "no boot record") for r in boots.rows if r.record is None],
        boots.dbx,
        {r.node for r in boots.rows if r.stale},
    )


def _selected(found: Fleet, selectors: Sequence[fleet.Selector]) -> Fleet:
    if not selectors:
        return found
    keep = [
        (n, r)
        for n, r in found.records
        if fleet.matches(r, selectors, {"node": n, "stale": "true" if n in found.stale else "false"})
    ]
    return Fleet(keep, [], found.dbx, found.stale)


def _policies(args: argparse.Namespace) -> tuple[Policies, Policies | None, Settings | None]:
    current = _settings(args.current, "--current") if args.current else None
    now = Policies(current.measured_boot, current.pcr_policy) if current is not None else None
    if args.config is not None:
        new = _settings(args.config, "--config")
        return Policies(new.measured_boot, new.pcr_policy), now, new
    policy = load_policy(args.measured_boot)
    if current is not None:
        # what the config load would refuse with the selection in force
        problem = policy.missing_pcrs(current.pcr_policy.pcrs) or policy.bank_problem(current.pcr_policy.bank)
        if problem:
            raise Usage(f"--measured-boot {args.measured_boot}: {problem} (pcr_policy of --current)")
    return Policies(policy, current.pcr_policy if current is not None else None), now, None


# -- boot side ---------------------------------------------------------------------------------


def _finding_lines(change: Change) -> list[str]:
    after = change.after
    if after.mismatches:
        return [f"    rule pcr_policy: {m}" for m in after.mismatches[:SHOWN_FINDINGS]]
    lines = [
        f"    rule {f.rule}: {f.where or '(the log lacks it)'}: {f.detail}"
        + (f" [class {f.pcr_class}]" if f.pcr_class else "")
        for f in after.findings[:SHOWN_FINDINGS]
    ]
    more = len(after.findings) - SHOWN_FINDINGS
    if more > 0:
        lines.append(f"    and {more} more")
    return lines or [f"    {after.reason[:500]}"]


def _class_text(pcr_class: str | None, mb_class: str | None) -> str:
    return f"pcr {pcr_class or '-'}, measured boot {mb_class or '-'}"


def render_text(changes: Sequence[Change], without: Sequence[tuple[str, str]]) -> str:
    by: dict[str, list[Change]] = {}
    for c in changes:
        by.setdefault(c.kind, []).append(c)
    out: list[str] = []

    def section(title: str, items: list[Change], detail: bool) -> None:
        out.append(f"{title} ({len(items)}):")
        for c in items:
            stale = " (stale record: rebooted since)" if c.stale else ""
            if c.kind == "class":
                head = (
                    f"  {c.node}: {_class_text(c.before.pcr_class, c.before.measured_boot_class)} -> "
                    f"{_class_text(c.after.pcr_class, c.after.measured_boot_class)}{stale}"
                )
            elif c.kind == "unknown":
                head = f"  {c.node}: {c.after.reason}{stale}"
            elif c.kind == "passes":
                classes = _class_text(c.after.pcr_class, c.after.measured_boot_class)
                head = f"  {c.node}: passes as {classes}{stale}"
            else:
                head = f"  {c.node}: {c.after.code}{stale}"
            out.append(head)
            if detail:
                out.extend(_finding_lines(c))

    section("would be refused", by.get("refused", []), True)
    section("would change class", by.get("class", []), False)
    section("would newly pass", by.get("passes", []), False)
    if by.get("still-refused"):
        section("refused now and still", by["still-refused"], True)
    section("cannot tell from the record", by.get("unknown", []), False)
    out.append(f"unchanged: {len(by.get('same', []))} node(s)")
    if without:
        shown = ", ".join(f"{n} ({why})" for n, why in without[:10])
        out.append(
            f"not judged, no boot record: {len(without)} node(s): {shown}"
            + (" ..." if len(without) > 10 else "")
        )
    return "\n".join(out) + "\n"


def change_json(c: Change) -> dict[str, Any]:
    a = c.after
    return {
        "node": c.node,
        "kind": c.kind,
        "stale": c.stale,
        "before": {
            "outcome": c.before.outcome,
            "pcrClass": c.before.pcr_class,
            "measuredBootClass": c.before.measured_boot_class,
        },
        "after": {
            "outcome": a.outcome,
            "code": a.code,
            "reason": a.reason,
            "pcrClass": a.pcr_class,
            "measuredBootClass": a.measured_boot_class,
            "findings": [
                {"rule": f.rule, "event": f.where, "class": f.pcr_class, "detail": f.detail}
                for f in a.findings
            ],
            "pcrMismatches": [str(m) for m in a.mismatches],
        },
    }


def _exit_code(changes: Sequence[Change], denied: int = 0) -> int:
    if denied or any(c.kind == "refused" for c in changes):
        return EXIT_REFUSED
    if any(c.kind == "unknown" for c in changes):
        return EXIT_UNKNOWN
    return EXIT_CLEAR


async def _boots(args: argparse.Namespace, selectors: list[fleet.Selector]) -> int:
    new, current, new_settings = _policies(args)
    if args.records is not None:
        found = _records_file(args.records)
    else:
        source = new_settings or (_settings(args.current, "--current") if args.current else None)
        if source is None:
            raise Usage(
                "give --records FILE (kubectl nodegate boots -o json) or a config that names the store"
            )
        found = await _store_fleet(source, args)
    found = _selected(found, selectors)
    changes = compare(found.records, new, current, found.dbx, found.stale)
    if args.output == "json":
        doc = {
            "changes": [change_json(c) for c in changes if c.kind != "same"],
            "unchanged": sum(1 for c in changes if c.kind == "same"),
            "withoutRecord": [{"node": n, "why": w} for n, w in found.without],
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(render_text(changes, found.without))
    return _exit_code(changes)


# -- package side ------------------------------------------------------------------------------


def _denied(entries: list[dict[str, Any]]) -> dict[tuple[str, str], list[str]]:
    return {(e["kind"], e["name"]): e["violations"] for e in entries}


async def _cluster_packages(
    args: argparse.Namespace, want_policies: bool
) -> tuple[list[Any], list[PackagePolicy]]:
    kube = await _kube(None, args)
    try:
        crs: list[Any] = []
        for group, version, plural in PACKAGE_RESOURCES:
            try:
                items, _ = await kube.list_cluster_objects(group, version, plural)
            except NotServed:
                continue
            crs += items
        policies: list[PackagePolicy] = []
        if want_policies:
            items, _ = await kube.list_cluster_objects("nodegate.io", "v1alpha1", "packagepolicies")
            for obj in items:
                try:
                    policies.append(PackagePolicy.model_validate(obj))
                except ValidationError:
                    name = str((obj.get("metadata") or {}).get("name", ""))[:253]
                    print(
                        f"{PROG}: the cluster's PackagePolicy {name} is invalid (the webhook ignores it)",
                        file=sys.stderr,
                    )
        return crs, policies
    finally:
        await kube.close()


async def _packages(args: argparse.Namespace) -> int:
    new = load_policies(args.policy)
    offline_crs = [doc for p in args.objects for doc in documents(p)]
    need_cluster = not args.objects or not args.current_policy
    crs, cluster_policies = (
        await _cluster_packages(args, not args.current_policy) if need_cluster else ([], [])
    )
    crs = offline_crs or crs
    current = load_policies(args.current_policy) if args.current_policy else cluster_policies
    before = _denied(audit_objects(current, crs))
    after = _denied(audit_objects(new, crs))
    newly = {k: v for k, v in after.items() if k not in before}
    allowed = [k for k in before if k not in after]
    if args.output == "json":
        doc = {
            "newlyDenied": [{"kind": k, "name": n, "violations": v} for (k, n), v in sorted(newly.items())],
            "stillDenied": [{"kind": k, "name": n} for (k, n) in sorted(set(after) & set(before))],
            "newlyAllowed": [{"kind": k, "name": n} for (k, n) in sorted(allowed)],
            "judged": sum(
                1 for o in crs if isinstance(o, dict) and o.get("kind") in ("NodeWright", "Skyhook")
            ),
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        lines = [f"would be denied ({len(newly)}):"]
        for (kind, name), violations in sorted(newly.items()):
            lines.append(f"  {kind} {name}:")
            lines += [f"    {v}" for v in violations]
        lines.append(f"denied now and still ({len(set(after) & set(before))})")
        lines.append(
            f"would newly be allowed ({len(allowed)}): " + ", ".join(f"{k} {n}" for k, n in sorted(allowed))
        )
        sys.stdout.write("\n".join(lines) + "\n")
    return EXIT_REFUSED if newly else EXIT_CLEAR


# -- entry -------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    chosen = [f for f in ("config", "measured_boot", "policy") if getattr(args, f)]
    if len(chosen) != 1:
        print(f"{PROG}: give exactly one of --config, --measured-boot, --policy", file=sys.stderr)
        return EXIT_USAGE
    try:
        selectors = [fleet.parse_where(w) for w in args.where]
        if args.policy:
            return asyncio.run(_packages(args))
        return asyncio.run(_boots(args, selectors))
    except (Usage, ToolError, fleet.SelectorError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
    except (StoreUnavailable, StoreSchemaError, KubeUnavailable, NotServed) as exc:
        print(f"{PROG}: {' '.join(str(exc).split())[:500]}", file=sys.stderr)
    return EXIT_USAGE
