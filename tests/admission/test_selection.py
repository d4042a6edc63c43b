"""admission.hold.selection and admission.hold.removals as pure functions (issue 33, findings 4 and 5)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from admission.hold import removals, selection
from admission.hold.selection import PackageSelector, selection_violations, selector_matches
from bootstrap.gate import holds

KEYS = ["pool", "zone", "nvidia.com/gpu.product"]
VALUES = ["a", "b", ""]
LABELS = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3)
EXPRESSION = st.fixed_dictionaries(
    {
        "key": st.sampled_from(KEYS),
        "operator": st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Near"]),
        "values": st.lists(st.sampled_from(VALUES), max_size=2),
    }
)
SELECTOR: st.SearchStrategy[Any] = st.none() | st.fixed_dictionaries(
    {}, optional={"matchLabels": LABELS, "matchExpressions": st.lists(EXPRESSION, max_size=2)}
)
SELECTORS = st.lists(SELECTOR, max_size=4).map(
    lambda sels: [PackageSelector(f"skyhook.nvidia.com/cr-{i}", s) for i, s in enumerate(sels)]
)


def node(labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-1", "labels": labels}}


def test_the_gate_and_the_webhook_read_selectors_alike() -> None:
    assert holds.selector_matches is selector_matches


@settings(max_examples=300, deadline=None)
@given(before=LABELS, after=LABELS, selectors=SELECTORS)
def test_an_admitted_kubelet_label_change_never_leaves_a_crs_selection(
    before: dict[str, str], after: dict[str, str], selectors: list[PackageSelector]
) -> None:
    """Whatever the CRs and labels: a kubelet's change the rule admits keeps every CR that selected
    the node selecting it (so the gate holds it for all of them); one it refuses names a CR that
    would have let go, and is admitted for anyone else."""
    found = selection_violations(
        "UPDATE", node(after), node(before), username="system:node:gpu-1", selectors=selectors
    )
    left = [
        s.ref
        for s in selectors
        if selector_matches(s.selector, before) and not selector_matches(s.selector, after)
    ]
    if found:
        assert left
        assert [v.rule for v in found] == [selection.RULE]
        assert left[0] in found[0].message
    else:
        assert left == []
    admin = selection_violations("UPDATE", node(after), node(before), username="alice", selectors=selectors)
    assert admin == []
    unknown = selection_violations(
        "UPDATE", node(after), node(before), username="system:node:gpu-1", selectors=None
    )
    assert bool(unknown) == (before != after)  # fail closed, but only for a label change


def test_creates_are_not_changes_of_selection() -> None:
    sels = [PackageSelector("skyhook.nvidia.com/x", {"matchLabels": {"pool": "a"}})]
    found = selection_violations("CREATE", node({}), None, username="system:node:gpu-1", selectors=sels)
    assert found == []


def test_which_finalizer_removals_count() -> None:
    def cr(*finalizers: Any) -> dict[str, Any]:
        return {"metadata": {"name": "x", "finalizers": list(finalizers)}}

    assert removals.drops_finalizer(cr("skyhook.nvidia.com/skyhook"), cr())
    assert removals.drops_finalizer(cr("nodewright.nvidia.com/nodewright", "x/y"), cr("x/y"))
    assert removals.drops_finalizer(cr("skyhook.nvidia.com/skyhook"), {"metadata": {}})
    assert not removals.drops_finalizer(cr(), cr("skyhook.nvidia.com/skyhook"))  # the operator adds it
    assert not removals.drops_finalizer(cr("x/y"), cr())  # another controller's finalizer
    assert not removals.drops_finalizer(cr("skyhook.nvidia.com/skyhook"), cr("skyhook.nvidia.com/skyhook"))
    assert not removals.drops_finalizer({"metadata": {"finalizers": "garbage"}}, cr())
