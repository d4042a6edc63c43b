"""bootstrap/gate/crindex.py: a package CR decoded once per watch event, its per-node reports
updated incrementally. The incremental index must equal the full recomputation
(nodewright.index_reports over the decoded status) for any sequence of status updates, name
exactly the nodes whose report changed, and a burst of events must coalesce into one decision per
node on the last state of every node."""

from __future__ import annotations

import json
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from bootstrap.config import GateSettings
from bootstrap.gate import crindex, holds
from bootstrap.gate.cache import Cache
from bootstrap.gate.nodewright import index_reports
from bootstrap.gate.queue import WorkQueue
from bootstrap.kube import Kube, WatchEvent

NODES = [f"n{i}" for i in range(5)]
STAGES = ["apply", "config", "interrupt", "post-interrupt", None, 7]
STATES = ["in_progress", "complete", "erroring", None, ["x"]]

# One package entry as the operator writes it (name, version, image, stage, state), or junk.
entries = st.one_of(
    st.fixed_dictionaries(
        {"name": st.just("p"), "stage": st.sampled_from(STAGES), "state": st.sampled_from(STATES)},
        optional={"image": st.sampled_from(["img:1", "img:2"]), "restarts": st.integers(0, 2)},
    ),
    st.sampled_from([None, "junk", 3, [1]]),
)
keys = st.sampled_from(["p|1.0", "p|2.0", "q|1.0"])
node_states = st.one_of(st.dictionaries(keys, entries, max_size=3), st.sampled_from([None, "junk", [1]]))
statuses = st.one_of(
    st.sampled_from(["complete", "in_progress", "blocked", "erroring"]), st.sampled_from([None, 5])
)
status_bodies = st.fixed_dictionaries(
    {},
    optional={
        "nodeState": st.one_of(
            st.dictionaries(st.sampled_from(NODES), node_states, max_size=5), st.just([1])
        ),
        "nodeStatus": st.dictionaries(st.sampled_from(NODES), statuses, max_size=5),
        "conditions": st.just([]),
    },
)
specs = st.sampled_from([("1.0",), ("2.0",), ("1.0", "1.0"), ("2.0", "1.0")])  # versions of p (and q)


def _cr(versions: tuple[str, ...], status: dict[str, Any]) -> dict[str, Any]:
    packages = {"p": {"version": versions[0]}}
    if len(versions) > 1:
        packages["q"] = {"version": versions[1]}
    return {
        "apiVersion": "skyhook.nvidia.com/v1alpha1",
        "kind": "Skyhook",
        "metadata": {"name": "sky", "resourceVersion": "1"},
        "spec": {"nodeSelectors": {}, "packages": packages},
        "status": status,
    }


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(st.tuples(specs, status_bodies, st.booleans()), min_size=1, max_size=8))
def test_incremental_index_equals_full_recomputation(
    steps: list[tuple[tuple[str, ...], dict[str, Any], bool]],
) -> None:
    prev: crindex.Reports | None = None
    before: dict[str, holds.NodeReport] = {}
    for versions, status, as_json in steps:
        obj = _cr(versions, status)
        packages = list(holds.parse_cr(obj).packages.values())
        full = index_reports(status, packages)
        # Either as the watch hands it (JSON, reports left undecoded) or already decoded.
        doc = (
            crindex.DECODER.from_json(json.dumps(obj).encode())
            if as_json
            else crindex.DECODER.from_mapping(obj)
        )
        keys = [f"{p.name}|{p.version}" for p in packages]
        reports, changed = crindex.update(prev, doc.states, doc.statuses, keys)
        assert dict(reports.by_node) == full
        assert changed == {n for n in before.keys() | full.keys() if before.get(n) != full.get(n)}
        assert crindex.index(doc.states, doc.statuses, keys).by_node == full
        prev, before = reports, full


def test_the_decoder_keeps_what_parse_cr_reads_and_leaves_reports_undecoded() -> None:
    status = {
        "nodeState": {"n0": {"p|1.0": {"stage": "config", "state": "complete"}}},
        "nodeStatus": {"n0": "complete"},
        "conditions": [{"type": "TaintNotTolerable", "status": "True", "message": "m"}],
        "configUpdates": {"p": ["kernel.x"]},
        "status": "complete",
    }
    obj = _cr(("1.0",), status)
    doc = crindex.DECODER.from_json(json.dumps(obj, separators=(",", ":")).encode())
    assert "nodeState" not in doc.obj["status"]
    assert doc.obj["status"]["configUpdates"] == {"p": ["kernel.x"]}
    assert bytes(doc.states["n0"]) == b'{"p|1.0":{"stage":"config","state":"complete"}}'  # type: ignore[call-overload]
    light = holds.parse_cr(doc.obj)
    whole = holds.parse_cr(obj)
    assert light == whole  # everything but the reports (not part of equality)
    assert light.conditions == whole.conditions
    assert light.config_updates == whole.config_updates
    # A status msgspec's typed decode refuses (nodeState not an object) reads as before.
    odd = crindex.DECODER.from_json(json.dumps(_cr(("1.0",), {"nodeState": [1]})).encode())
    assert odd.states == {}


def _event(rv: int, states: dict[str, str]) -> WatchEvent[Any]:
    """The operator's CR after a status write: every node's report, as JSON through the decoder."""
    status = {
        "nodeState": {n: {"p|1.0": {"name": "p", "stage": "config", "state": s}} for n, s in states.items()},
        "nodeStatus": {n: "complete" if s == "complete" else "in_progress" for n, s in states.items()},
    }
    obj = _cr(("1.0",), status)
    obj["metadata"]["resourceVersion"] = str(rv)
    return WatchEvent("MODIFIED", crindex.DECODER.from_json(json.dumps(obj).encode()))


def test_a_burst_of_status_events_coalesces_without_losing_any_nodes_last_state() -> None:
    queue = WorkQueue()
    queue.running = True
    named: list[str] = []

    def changed(name: str) -> None:
        named.append(name)
        queue.add(name)

    cache = Cache(cast(Kube, None), GateSettings(), changed=changed)  # no API call is made here
    nodes, crs = cache.sources["nodes"], cache.sources["skyhook.nvidia.com"]
    nodes.objects, crs.objects = {}, {}
    fleet = [f"n{i:03d}" for i in range(200)]
    for n in fleet:
        cache.apply_event(nodes, WatchEvent("ADDED", {"metadata": {"name": n, "resourceVersion": "1"}}))
    state = dict.fromkeys(fleet, "in_progress")
    cache.apply_event(crs, _event(2, state))
    drained = []
    while (name := queue.pop()) is not None:
        drained.append(name)
    named.clear()
    # A burst as the operator writes it while nodes progress: each write rewrites the whole
    # status; some nodes move several times, one goes back, the worker takes nothing meanwhile.
    sequence = [
        (n, s) for i, n in enumerate(fleet[:120]) for s in (("apply", "complete") if i % 3 else ("complete",))
    ]
    sequence += [(fleet[7], "erroring"), (fleet[200 - 1], "complete")]
    for rv, (node, new) in enumerate(sequence, start=3):
        state[node] = new
        cache.apply_event(crs, _event(rv, state))
    queued = []
    while (name := queue.pop()) is not None:
        queued.append(name)
    # Each node whose report changed is queued once, however many events named it ...
    assert sorted(queued) == sorted(set(queued))
    moved = {n for n, _ in sequence}
    assert set(queued) == moved
    assert set(named) == moved  # ... and no other node was named
    # ... and the cache holds every node's last state, as a full index of the last event says.
    (cr,) = cache.package_crs()
    for n in fleet:
        report = cr.reports[n]
        assert report.entries == (("config", state[n]),)
    assert crs.rv == str(2 + len(sequence))
