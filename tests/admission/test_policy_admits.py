"""``policy_admits``, the decider's early-stopping question, answers exactly ``not
compiled_violations`` for every CR and policy (the list itself is built only for a denial)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission.policies import rules
from tests.admission.test_admission_rules import _compiled_policies, _cr, _spoil


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=_cr, data=st.data())
def test_policy_admits_is_no_violations(obj: dict[str, Any], data: st.DataObject) -> None:
    if data.draw(st.booleans()):
        _spoil(data, obj)
    viewed = rules.read_package_cr(obj)
    if isinstance(viewed, list):
        return  # malformed: the decider denies before any policy is asked
    for compiled in _compiled_policies():
        assert rules.policy_admits(viewed, compiled) == (not rules.compiled_violations(viewed, compiled))


def test_a_policy_that_finds_something_does_not_admit() -> None:
    """Both answers occur among the sample policies (the property above is not vacuous)."""
    cr = rules.read_package_cr(
        {
            "apiVersion": "skyhook.nvidia.com/v1alpha1",
            "kind": "Skyhook",
            "metadata": {"name": "s"},
            "spec": {
                "interruptionBudget": {"percent": 10},
                "packages": {"pkg": {"version": "1.0.0", "image": "ghcr.io/nvidia/pkg"}},
            },
        }
    )
    assert isinstance(cr, rules.CrView)
    answers = {rules.policy_admits(cr, compiled) for compiled in _compiled_policies()}
    assert answers == {True, False}
    for compiled in _compiled_policies():
        assert rules.policy_admits(cr, compiled) == (not rules.compiled_violations(cr, compiled))
