"""A package CR as the gate reads it from a watch: decoded once, its per-node reports indexed
incrementally. Pure: no I/O, no clock.

The operator keeps a report per selected node in one CR's status (``status.nodeState`` and
``status.nodeStatus``: ~1 MiB at 10,000 nodes) and rewrites the CR for every node's progress, so
each progress is a watch event carrying every node's report. Decoding all of them and re-indexing
every node per event costs tens of milliseconds; here the event is decoded by msgspec into the
parts the gate parses (metadata, spec, the small status fields) while each node's report stays
undecoded JSON (``msgspec.Raw``). :func:`update` compares each node's JSON with what the last event
said (bytes, in C) and decodes only the nodes whose JSON changed: one node's progress costs one
node's decode. Equal JSON is an equal report; a report whose JSON changed is compared again after
decoding, so only nodes whose (stage, state) or status really changed are named for a decision.

:func:`index` (everything) and :func:`update` (what changed) give the same reports: the tests
check it against ``nodewright.index_reports`` for any sequence of status updates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from bootstrap.gate.nodewright import MALFORMED, Entry, NodeReport, _word
from bootstrap.kube.decode import loads

_ABSENT = object()  # a package the node's entry does not mention (not the same as JSON null)


class _Status(msgspec.Struct):
    nodeState: dict[str, msgspec.Raw] | None = None  # the CRD's field names
    nodeStatus: dict[str, msgspec.Raw] | None = None
    conditions: Any = None
    configUpdates: Any = None
    status: Any = None


class _Cr(msgspec.Struct):
    apiVersion: Any = None
    kind: Any = None
    metadata: Any = None
    spec: Any = None
    status: _Status | None = None


_DECODE_CR = msgspec.json.Decoder(_Cr)


@dataclass(frozen=True, slots=True)
class CrDoc:
    """A package CR: ``obj`` is the object without ``status.nodeState`` and ``status.nodeStatus``
    (what ``parse_cr`` reads); those two are per node, each value undecoded JSON
    (``msgspec.Raw``) or, when the object came decoded, the value itself."""

    obj: dict[str, Any]
    states: Mapping[str, object] = field(default_factory=dict)
    statuses: Mapping[str, object] = field(default_factory=dict)


class CrDecoder:
    """The watch's and the list's decoder for package CRs (bootstrap.kube.decode.ObjectDecoder)."""

    def from_json(self, data: bytes | msgspec.Raw) -> CrDoc:
        try:
            cr = _DECODE_CR.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            # Not the shape upstream writes (a status that is not an object, JSON msgspec refuses):
            # decoded whole, read exactly as before.
            whole = loads(data)
            if not isinstance(whole, dict):
                raise ValueError("a package CR that is not a JSON object") from None  # noqa: TRY004
            return self.from_mapping(whole)
        obj: dict[str, Any] = {}
        for key in ("apiVersion", "kind", "metadata", "spec"):
            value = getattr(cr, key)
            if value is not None:
                obj[key] = value
        st = cr.status
        if st is None:
            return CrDoc(obj)
        status = {
            k: getattr(st, k) for k in ("conditions", "configUpdates", "status") if getattr(st, k) is not None
        }
        obj["status"] = status
        return CrDoc(obj, st.nodeState or {}, st.nodeStatus or {})

    def from_mapping(self, obj: dict[str, Any]) -> CrDoc:
        status = obj.get("status")
        if not isinstance(status, Mapping):
            return CrDoc(obj)
        states, statuses = status.get("nodeState"), status.get("nodeStatus")
        light = {**obj, "status": {k: v for k, v in status.items() if k not in ("nodeState", "nodeStatus")}}
        return CrDoc(
            light,
            states if isinstance(states, Mapping) else {},
            statuses if isinstance(statuses, Mapping) else {},
        )


DECODER = CrDecoder()


@dataclass(frozen=True, slots=True)
class Reports:
    """One CR's reports per node, and what they were computed from (for the next update)."""

    keys: tuple[str, ...]  # the spec packages' ``name|version``, in the order of PackageCr.packages
    states: Mapping[str, object]
    statuses: Mapping[str, object]
    by_node: Mapping[str, NodeReport]


def _value(raw: object) -> object:
    """A report's value: None for absent or JSON null, the decoded JSON otherwise."""
    if isinstance(raw, msgspec.Raw):
        try:
            return loads(raw)
        except ValueError:
            return _MALFORMED_JSON
    return raw


_MALFORMED_JSON = object()  # cannot happen for a part of a decoded event; read as malformed


def _entry(value: object) -> Entry | None:
    if value is _ABSENT:
        return None
    if not isinstance(value, Mapping):
        return MALFORMED
    stage, state = value.get("stage"), value.get("state")
    return (_word(stage), _word(state))


def node_report(state: object, status: object, keys: Sequence[str]) -> NodeReport:
    """What ``nodewright.index_reports`` says of one node, from its raw or decoded
    ``status.nodeState[node]`` and ``status.nodeStatus[node]`` (None: absent)."""
    value = _value(state)
    entries: tuple[Entry | None, ...] | None = None
    if isinstance(value, Mapping):
        entries = tuple(_entry(value.get(k, _ABSENT)) for k in keys)
    elif value is not None:
        entries = tuple(MALFORMED for _ in keys)
    word = _value(status)
    return NodeReport(_word(word) if isinstance(word, str) else None, entries)


def index(states: Mapping[str, object], statuses: Mapping[str, object], keys: Sequence[str]) -> Reports:
    """Every node's report. Nodes whose JSON is the same share one decode and one report (most
    nodes of a big CR report the same)."""
    by_raw: dict[tuple[bytes, bytes], NodeReport] = {}
    shared: dict[NodeReport, NodeReport] = {}
    out: dict[str, NodeReport] = {}
    for node in states.keys() | statuses.keys():
        state, status = states.get(node), statuses.get(node)
        key = _raw_key(state, status)
        report = by_raw.get(key) if key is not None else None
        if report is None:
            report = node_report(state, status, keys)
            report = shared.setdefault(report, report)
            if key is not None:
                by_raw[key] = report
        out[str(node)] = report
    return Reports(tuple(keys), states, statuses, out)


def _raw_key(state: object, status: object) -> tuple[bytes, bytes] | None:
    parts = []
    for x in (state, status):
        if x is None:
            parts.append(b"")
        elif isinstance(x, msgspec.Raw):
            parts.append(bytes(x))
        else:
            return None  # a decoded value: no shared decode to save
    return parts[0], parts[1]


def update(
    prev: Reports | None, states: Mapping[str, object], statuses: Mapping[str, object], keys: Sequence[str]
) -> tuple[Reports, set[str]]:
    """The reports after a new version of the CR, and the nodes whose report changed. Only the
    nodes whose JSON differs from ``prev`` are decoded; with other spec packages (``keys``)
    everything is indexed again."""
    if prev is None or prev.keys != tuple(keys):
        new = index(states, statuses, keys)
        old = prev.by_node if prev is not None else {}
        return new, _differ(old, new.by_node, old.keys() | new.by_node.keys())
    touched: set[str] = set()
    for seen, now in ((prev.states, states), (prev.statuses, statuses)):
        differ = [n for n, v in now.items() if seen.get(n, _ABSENT) != v]
        touched.update(differ)
        # A node can have left only if the map shrank or a node arrived (same size, no new key:
        # the same keys); the set difference is paid only then.
        if len(seen) != len(now) or any(n not in seen for n in differ):
            touched.update(seen.keys() - now.keys())
    if not touched:
        return Reports(prev.keys, states, statuses, prev.by_node), set()
    by_node = dict(prev.by_node)
    changed: set[str] = set()
    for node in touched:
        state, status = states.get(node), statuses.get(node)
        before = by_node.get(node)
        if node not in states and node not in statuses:
            by_node.pop(node, None)
            report = None
        else:
            report = by_node[node] = node_report(state, status, keys)
        if report != before:
            changed.add(node)
    return Reports(prev.keys, states, statuses, by_node), changed


def _differ(old: Mapping[str, NodeReport], new: Mapping[str, NodeReport], nodes: Iterable[str]) -> set[str]:
    return {n for n in nodes if old.get(n) != new.get(n)}
