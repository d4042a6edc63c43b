"""`kubectl nodegate status [NODE] [-o table|json] [--kubeconfig FILE]`: why nodes are held;
`kubectl nodegate boots [NODE] [--where FIELD=VALUE]`: what booted where (``kubectlboots``).

Every Node (or one) is joined by name with its NodeAttestation and shown with the hold taint it
carries, the phase and reason the gate last wrote, what it still waits for, when it attested and
its SPIFFE ID. Disagreements between the taint and the status are shown, not hidden: a node that
is tainted but Ready means the gate has not caught up; an untainted node that is Held (or has no
valid attestation at all) is schedulable although it should not be.

Only reads; exit codes: 0 ok, 1 the named node does not exist, 2 usage, kubeconfig or API errors
(one line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

from bootstrap.config import GateSettings
from bootstrap.gate import holds, kubectlboots, nodewright, podfailure
from bootstrap.gate import kubectlopts as opts
from bootstrap.gate.cache import ATTESTATIONS
from bootstrap.gate.kubectlopts import NodeNotFound, StatusError, UsageError, age, kubeconfig_path
from bootstrap.kube import Conflict, Kube, KubeUnavailable, NotFound, NotServed
from bootstrap.names import is_node_name
from bootstrap.times import optional_rfc3339, parse_time

GROUP, VERSION, PLURAL = ATTESTATIONS
DEFAULT_TAINT_KEY = GateSettings().taint_key
PROG = "kubectl nodegate"
NOT_SERVED_NOTE = (
    "nodeattestations.nodegate.io is not served by this cluster (CRD not installed): "
    "showing nodes without attestations"
)
WAITING_LIMIT = 80  # table cell; the JSON carries everything
_CELL_LIMITS = (253, 48, 16, 32, WAITING_LIMIT, 8, 100)  # per column; names are at most 253
_TEXT_LIMIT = 4096
_ITEMS_LIMIT = 1000  # packages per node read from one object; more is malformed
# Where NodeWright's completion rule can end (docs/gate.md, "What decides"); used only when the
# gate did not write its own verdict for a package.
_DONE_STAGES = ("config", "post-interrupt")


# One entry of status.packages as the gate wrote it: the gate's own type.
PackageRow = holds.PackageStatus


def _summary(row: PackageRow) -> str:
    where = "/".join(x for x in (row.stage, row.state) if x) or "not started"
    return f"{row.cr}: {row.package} {row.version} ({where})"


@dataclass(frozen=True, slots=True)
class NodeRow:
    node: str
    hold: str | None  # the hold taint's value; None when the node carries no hold taint
    hold_effect: str | None
    attestation: bool  # a NodeAttestation bound to an EK exists (not missing, not forgotten)
    attestation_problem: str | None  # why the attestation is not valid; None when it is
    # valid, missing, forgotten, incomplete, revoked, expired, stale (older than the gate's
    # attestation_lifetime: renewals stopped), rebooted (the Node runs a boot nobody attested) or
    # no-boot-id (the Node reports none to compare)
    attestation_state: str
    boot_id: str | None  # the Node's status.nodeInfo.bootID
    attested_boot_id: str | None  # the NodeAttestation's status.bootID
    reset_count: int | None  # the TPM resetCount of that attestation
    revoked: bool
    phase: str | None  # status.phase as the gate wrote it
    reason: str | None
    message: str
    packages: tuple[PackageRow, ...]
    attested_at: datetime | None
    expires_at: datetime | None
    complete_since: datetime | None
    observed_at: datetime | None
    spiffe_id: str | None
    mismatch: str | None  # the taint and the status disagree (gate lagging, or the taint was changed)

    @property
    def shown_phase(self) -> str:
        if self.phase:
            return self.phase
        return "-" if self.attestation else "Unattested"

    @property
    def waiting(self) -> tuple[str, ...]:
        """What the node waits for, most telling first."""
        items: list[str] = [self.mismatch] if self.mismatch else []
        if self.attestation_problem:
            items.append(self.attestation_problem)
        pending = [_summary(p) for p in self.packages if not p.complete]
        if pending:
            items.extend(podfailure.failure_causes(self.message))  # why a package failed: its pod
            items.extend(nodewright.blocked_causes(self.message))  # why those packages do not start
        items.extend(pending)
        held = self.hold is not None or self.phase in ("Held", "Quarantined")
        if not pending and not self.attestation_problem and held and self.message:
            # Everything complete yet held: the gate's own words (stability window, interrupts).
            items.append(self.message)
        if not items and self.phase is None:
            items.append("not yet decided by the gate")
        return tuple(items)

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "hold": self.hold,
            "holdEffect": self.hold_effect,
            "attestation": self.attestation,
            "attestationValid": self.attestation_problem is None,
            "attestationState": self.attestation_state,
            "bootID": self.boot_id,
            "attestedBootID": self.attested_boot_id,
            "resetCount": self.reset_count,
            "revoked": self.revoked,
            "phase": self.phase,
            "reason": self.reason,
            "message": self.message,
            "waitingFor": list(self.waiting),
            "packages": [p.to_json() for p in self.packages],
            "attestedAt": optional_rfc3339(self.attested_at),
            "expiresAt": optional_rfc3339(self.expires_at),
            "completeSince": optional_rfc3339(self.complete_since),
            "observedAt": optional_rfc3339(self.observed_at),
            "spiffeId": self.spiffe_id,
            "mismatch": self.mismatch,
        }


@dataclass(frozen=True, slots=True)
class Status:
    rows: tuple[NodeRow, ...]
    attestations_served: bool  # False: the NodeAttestation CRD is not installed
    resource_version: str = ""  # of the node list: where --watch starts

    @property
    def note(self) -> str | None:
        return None if self.attestations_served else NOT_SERVED_NOTE


# -- reading -----------------------------------------------------------------------------------


async def status(
    kube: Kube,
    node: str | None = None,
    *,
    taint_key: str = DEFAULT_TAINT_KEY,
    now: datetime | None = None,
    selector: str | None = None,
) -> Status:
    """Rows for every Node (sorted by name), or for ``node`` alone (NodeNotFound if it does not
    exist). KubeUnavailable when the API cannot be read; an unserved NodeAttestation resource
    only sets ``attestations_served=False``."""
    now = now or datetime.now(UTC)
    if node is not None:
        obj = await kube.get_node(node)
        if obj is None:
            raise NodeNotFound(f'node "{node}" not found')
        att = await kube.get_cluster_object(GROUP, VERSION, PLURAL, node)
        served = att is not None or await _served(kube)
        return Status((node_row(obj, att, taint_key=taint_key, now=now),), served)
    nodes, node_rv = await kube.list_nodes(label_selector=selector)
    try:
        atts, _rv = await kube.list_cluster_objects(GROUP, VERSION, PLURAL)
    except NotServed:
        atts, served = [], False
    else:
        served = True
    by_name = {_name(a): a for a in atts}
    rows = [node_row(n, by_name.get(_name(n)), taint_key=taint_key, now=now) for n in nodes if _name(n)]
    return Status(tuple(sorted(rows, key=lambda r: r.node)), served, node_rv)


async def _served(kube: Kube) -> bool:
    """Whether the NodeAttestation resource exists: a get answers 404 either way, a list does not.
    The selector matches nothing, so the answer stays small."""
    try:
        await kube.list_cluster_objects(GROUP, VERSION, PLURAL, label_selector=f"{GROUP}/no-such-label")
    except NotServed:
        return False
    return True


def node_row(
    node: Mapping[str, Any],
    attestation: Mapping[str, Any] | None,
    *,
    taint_key: str = DEFAULT_TAINT_KEY,
    now: datetime | None = None,
) -> NodeRow:
    """One row from a Node and its NodeAttestation (None: there is none). Tolerates any shape."""
    now = now or datetime.now(UTC)
    taint = _hold_taint(node, taint_key)
    spec = _dict(attestation, "spec")
    st = _dict(attestation, "status")
    bound = attestation is not None and isinstance(spec.get("ekSha256"), str) and bool(spec["ekSha256"])
    # The gate's own reading of the object, so the two can never disagree on validity.
    view = holds.attestation_view(attestation) if bound else None
    phase = _text(st.get("phase")) or None
    reason = _text(st.get("reason")) or None
    hold = _text(taint.get("value")) if taint is not None else None
    boot = holds.node_boot_id(node)
    state, problem = _attestation_problem(attestation, view, boot, reason, now, holds.node_identity(node))
    return NodeRow(
        node=_name(node),
        hold=hold,
        hold_effect=(_text(taint.get("effect")) or None) if taint is not None else None,
        attestation=bound,
        attestation_problem=problem,
        attestation_state=state,
        boot_id=_text(boot) or None,
        attested_boot_id=(_text(view.boot_id) or None) if view is not None else None,
        reset_count=view.reset_count if view is not None else None,
        revoked=view is not None and view.revoked,
        phase=phase,
        reason=reason,
        message=_text(st.get("message")),
        packages=_packages(st.get("packages")),
        attested_at=parse_time(st.get("attestedAt")),
        expires_at=parse_time(st.get("expiresAt")),
        complete_since=parse_time(st.get("completeSince")),
        observed_at=parse_time(st.get("observedAt")),
        spiffe_id=_text(spec.get("spiffeId")) or None,
        mismatch=_mismatch(hold, phase, reason, valid=problem is None),
    )


def _attestation_problem(
    obj: Mapping[str, Any] | None,
    view: holds.AttestationView | None,
    boot: str | None,
    reason: str | None,
    now: datetime,
    identity: holds.NodeIdentity,
) -> tuple[str, str | None]:
    """(state, why) by the gate's own rule (holds.attestation_problem), so the two never disagree;
    the gate's attestation_lifetime is not known here: a status the gate wrote quarantined on an
    attestation that is otherwise valid says so."""
    if obj is not None and view is None:
        return "forgotten", "NodeAttestation has no EK (forgotten): the node must join again"
    problem = holds.attestation_problem(
        view, node_boot=boot, has_node=True, now=now, lifetime=None, node=identity
    )
    if problem is not None:
        return problem.kind, problem.text
    if reason == "quarantined":
        return "stale", "attestation older than the gate's attestation_lifetime: renewals stopped; join again"
    return "valid", None


def _mismatch(hold: str | None, phase: str | None, reason: str | None, *, valid: bool) -> str | None:
    if hold is not None and phase == "Ready":
        return "gate lagging: status is Ready but the node is still tainted"
    if hold is None and phase in ("Held", "Quarantined"):
        return f"not tainted although {phase} ({reason or 'no reason'}): gate lagging or taint removed"
    if hold is None and not valid:
        return "not tainted without a valid attestation: schedulable"
    if hold is not None and reason and hold != reason:
        return f"gate lagging: taint says {hold or '(empty)'}, status says {reason}"
    return None


def _hold_taint(node: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    taints = _dict(node, "spec").get("taints")
    if not isinstance(taints, list):
        return None
    return next((t for t in taints if isinstance(t, dict) and t.get("key") == key), None)


def _packages(value: object) -> tuple[PackageRow, ...]:
    if not isinstance(value, list):
        return ()
    out: list[PackageRow] = []
    for item in value[:_ITEMS_LIMIT]:
        if not isinstance(item, dict):
            continue
        stage = _text(item.get("stage")) or None
        state = _text(item.get("state")) or None
        complete = item.get("complete")
        out.append(
            PackageRow(
                cr=_text(item.get("cr")),
                package=_text(item.get("package")),
                version=_text(item.get("version")),
                stage=stage,
                state=state,
                # The gate's verdict when it wrote one; else the completion rule as far as the row
                # tells it (whether an interrupt is needed is not in the row: the message says).
                complete=complete
                if isinstance(complete, bool)
                else state == "complete" and stage in _DONE_STAGES,
            )
        )
    return tuple(out)


def _dict(obj: Mapping[str, Any] | None, key: str) -> dict[str, Any]:
    value = obj.get(key) if obj is not None else None
    return value if isinstance(value, dict) else {}


def _name(obj: Mapping[str, Any]) -> str:
    return _text(_dict(obj, "metadata").get("name"))


def _text(value: object) -> str:
    return value[:_TEXT_LIMIT] if isinstance(value, str) else ""


# -- rendering ---------------------------------------------------------------------------------

COLUMNS = ("NODE", "HOLD", "PHASE", "REASON", "WAITING FOR", "ATTESTED", "SPIFFE-ID")


def render_table(rows: Sequence[NodeRow], *, now: datetime | None = None) -> str:
    """kubectl-style columns, three spaces apart; cells are single-line, printable and capped."""
    now = now or datetime.now(UTC)
    body = [
        (
            r.node,
            _hold_cell(r),
            r.shown_phase,
            r.reason or "-",
            _waiting_cell(r.waiting),
            "-" if r.attested_at is None else age(now - r.attested_at),
            r.spiffe_id or "-",
        )
        for r in rows
    ]
    cells: list[tuple[str, ...]] = [COLUMNS]
    cells += [tuple(_cap(_clean(c), n) for c, n in zip(line, _CELL_LIMITS, strict=True)) for line in body]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells]
    return "\n".join(lines) + "\n"


def render_json(rows: Sequence[NodeRow]) -> str:
    # ensure_ascii (the default) escapes control characters: the output is safe on a terminal.
    return json.dumps([r.to_json() for r in rows], indent=2) + "\n"


def _hold_cell(row: NodeRow) -> str:
    if row.hold is None:
        return "-"
    value = row.hold or '""'
    return value if row.hold_effect in (None, "NoSchedule") else f"{value} ({row.hold_effect})"


def _waiting_cell(items: Sequence[str]) -> str:
    if not items:
        return "-"
    more = f" (+{len(items) - 1} more)" if len(items) > 1 else ""
    first = _clean(items[0])
    if len(first) + len(more) <= WAITING_LIMIT:
        return first + more
    return first[: WAITING_LIMIT - len(more) - 3] + "..." + more


def _cap(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _clean(text: str) -> str:
    # Cluster objects are written by others: no terminal control sequences, no line breaks, no
    # bidi overrides or other invisible characters.
    return "".join(c if c == " " or unicodedata.category(c)[0] not in "CZ" else "?" for c in text)


# -- command line ------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """One-line usage errors instead of argparse's usage block and SystemExit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            print(message, file=sys.stderr, end="")
        raise _Exit(status)


class _Exit(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _parser() -> _Parser:
    p = _Parser(prog=PROG, description="Why nodes are held.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    st = sub.add_parser("status", help="nodes, hold reasons and what each waits for")
    st.add_argument("node", nargs="?", metavar="NODE", help="one node (default: every node)")
    st.add_argument("-o", "--output", choices=opts.OUTPUTS, default="table")
    st.add_argument("--kubeconfig", metavar="FILE", help="default: $KUBECONFIG, ~/.kube/config, in-cluster")
    st.add_argument("--context", help="the kubeconfig context to use (default: its current-context)")
    st.add_argument("-l", "--selector", help="only nodes with these labels (a label selector, as kubectl)")
    st.add_argument("--reason", choices=opts.REASONS, help="only nodes held for this reason (none: not held)")
    st.add_argument(
        "-w", "--watch", action="store_true", help="after the list, a row each time a node changes"
    )
    st.add_argument("--taint-key", default=DEFAULT_TAINT_KEY, help=f"default {DEFAULT_TAINT_KEY}")
    kubectlboots.add_parser(sub)
    return p


async def _run(args: argparse.Namespace) -> tuple[str, str | None]:
    """(stdout text, a note for stderr or None)."""
    if args.node is not None and not is_node_name(args.node):
        raise UsageError(f"{args.node!r} is not a valid node name")
    selectors = kubectlboots.selectors(args)
    kube = await Kube.from_config(kubeconfig_path(args.kubeconfig), context=args.context)
    if kube is None:
        raise StatusError("no kubeconfig found and not running in a cluster; pass --kubeconfig")
    if args.command == "boots":
        try:
            return await kubectlboots.run(kube, args.node, selectors, args.output, args.namespace)
        finally:
            await kube.close()
    try:
        result = await status(kube, args.node, taint_key=args.taint_key, selector=args.selector)
        out = _render([r for r in result.rows if opts.held_for(r.hold, args.reason)], args.output)
        if args.watch:  # until interrupted, like kubectl get -w
            _write(out)
            out = ""
            row = functools.partial(node_row, taint_key=args.taint_key)
            await opts.follow(
                kube, result.resource_version, args, row, lambda rows: _render(rows, args.output), _write
            )
    finally:
        await kube.close()
    return out, result.note


def _render(rows: Sequence[NodeRow], output: str) -> str:
    if output == "json":
        return render_json(rows)
    if output == "yaml":
        return opts.render_yaml([r.to_json() for r in rows])
    return opts.render_wide(rows) if output == "wide" else render_table(rows)


def _fail(message: str) -> None:
    print(f"{PROG}: {_cap(_clean(message), 1000)}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 0
        out, note = asyncio.run(_run(args))
    except _Exit as exc:
        return exc.status
    except StatusError as exc:
        _fail(str(exc))
        return exc.exit_code
    except (KubeUnavailable, Conflict, NotFound) as exc:
        _fail(str(exc))
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001  (a bug still ends in one line, as promised)
        _fail(f"internal error: {type(exc).__name__}: {exc}")
        return 2
    if note:
        _fail(note)
    _write(out)
    return 0


def _write(out: str) -> None:
    try:
        sys.stdout.write(out)
        sys.stdout.flush()
    except BrokenPipeError:
        # `| head` closed the pipe: not an error; keep the interpreter's exit flush quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
