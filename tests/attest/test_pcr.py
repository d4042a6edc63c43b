"""PCR policy: golden classes, enforce and warn, clear reasons, and a real tampered boot."""

from __future__ import annotations

import functools
import hashlib
import os

import pytest

from attest import pcr, tpm
from attest.errors import PcrPolicyViolation
from bootstrap.node.tpm import Agent
from tests.support.swtpms import TpmInfo

A = "aa" * 32
B = "bb" * 32
C = "cc" * 32


def values(**pcrs: str) -> dict[str, dict[int, bytes]]:
    return {"sha256": {int(k[1:]): bytes.fromhex(v) for k, v in pcrs.items()}}


@functools.cache
def golden_policy() -> pcr.PcrPolicy:
    """Loaded when a test first asks, not at import: the YAML loader and the policy model are the
    installed ones, and a refusal there fails those tests, not the collection."""
    return pcr.load_policy(
        f"""
bank: sha256
pcrs: [0, 1, 7]
classes:
  - name: h100-fw-1
    golden:
      sha256:
        0: ["{A}"]
        7: ["{B}", "{C}"]
  - name: h100-fw-2-rollout
    mode: warn
    golden:
      sha256:
        0: ["{C}"]
"""
    )


def test_selection_comes_from_the_policy() -> None:
    assert golden_policy().selection == "sha256:0,1,7"
    assert pcr.load_policy("").selection == "sha256:0,1,2,3,4,5,6,7"


def test_matching_class_is_named() -> None:
    result = pcr.enforce(golden_policy(), values(p0=A, p1=A, p7=C))
    assert (result.ok, result.matched_class) == (True, "h100-fw-1")


def test_warn_class_match_passes() -> None:
    result = pcr.enforce(golden_policy(), values(p0=C, p1=A, p7=A))
    assert result.matched_class == "h100-fw-2-rollout"


def test_violation_names_the_pcr_and_what_was_expected() -> None:
    with pytest.raises(PcrPolicyViolation) as exc:
        pcr.enforce(golden_policy(), values(p0=A, p1=A, p7=A))
    assert exc.value.code == "pcr_policy_violation"
    assert f"class h100-fw-1: sha256:7 is {A}, expected one of [{B}, {C}]" in exc.value.detail
    result = pcr.evaluate(golden_policy(), values(p0=A, p1=A, p7=A))
    assert [(m.pcr_class, m.index) for m in result.violations] == [("h100-fw-1", 7)]
    assert [(m.pcr_class, m.index) for m in result.warnings] == [("h100-fw-2-rollout", 0)]


def test_missing_pcr_is_a_violation() -> None:
    result = pcr.evaluate(golden_policy(), values(p1=A, p7=B))
    assert not result.ok
    assert result.violations[0].actual is None


def test_only_warn_classes_never_refuse() -> None:
    policy = pcr.policy_from_obj(
        {"pcrs": [0], "classes": [{"name": "x", "mode": "warn", "golden": {"sha256": {0: [A]}}}]}
    )
    result = pcr.enforce(policy, values(p0=B))
    assert result.ok
    assert result.warnings
    assert not result.violations


def test_assigned_class_is_judged_alone() -> None:
    with pytest.raises(PcrPolicyViolation):
        pcr.enforce(golden_policy(), values(p0=C, p1=A, p7=B), node_class="h100-fw-1")
    with pytest.raises(PcrPolicyViolation, match="no class named"):
        pcr.enforce(golden_policy(), values(p0=A, p1=A, p7=B), node_class="unknown")


def test_empty_policy_records_only() -> None:
    result = pcr.enforce(pcr.load_policy("{}"), values(p0=A))
    assert (result.ok, result.matched_class) == (True, None)


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ("bank: md5", "unknown PCR bank"),
        ("pcrs: [0, 0]", "distinct"),
        ("pcrs: [24]", "0-23"),
        (f"pcrs: [0]\nclasses: [{{name: a, golden: {{sha256: {{1: ['{A}']}}}}}}]", "not quoted"),
        (f"classes: [{{name: a, golden: {{sha1: {{0: ['{'aa' * 20}']}}}}}}]", "policy quotes sha256"),
        ("classes: [{name: a, golden: {sha256: {0: ['zz']}}}]", "not hex"),
        ("classes: [{name: a, golden: {sha256: {0: ['aa']}}}]", "not 32 bytes"),
        ("classes: [{name: a, golden: {sha256: {0: []}}}]", "no golden value"),
        (
            f"classes: [{{name: a, golden: {{sha256: {{0: ['{A}']}}}}}},"
            f" {{name: a, golden: {{sha256: {{0: ['{A}']}}}}}}]",
            "unique",
        ),
        ("classes: [{name: a, golden: {}}]", "at least one golden value"),
        ("classes: [{name: a, golden: {sha256: {}}}]", "at least one golden value"),
        ("a: &x [1]\nb: *x", "aliases are not allowed"),
        ("[" * 5000, "not valid YAML"),
        (f"classes: [{{name: a, mode: audit, golden: {{sha256: {{0: ['{A}']}}}}}}]", "mode"),
        ("surprise: 1", "surprise"),
        ("[unclosed", "not valid YAML"),
    ],
)
def test_bad_policies_are_refused_at_load(doc: str, why: str) -> None:
    with pytest.raises(pcr.PolicyError, match=why):
        pcr.load_policy(doc)


def test_tampered_boot_on_swtpm_violates_the_policy(swtpm: TpmInfo) -> None:
    sel = "sha256:0,1,2,3,4,5,6,7"
    with Agent(swtpm.tcti) as agent:
        ak = agent.create_ak()
        golden = agent.read_pcrs(sel)["sha256"]
        policy = pcr.policy_from_obj(
            {"classes": [{"name": "fleet", "golden": {"sha256": {i: [v.hex()] for i, v in golden.items()}}}]}
        )
        agent.extend_pcr(4, hashlib.sha256(b"evil kernel").digest())
        nonce = os.urandom(32)
        quote, sig = agent.quote(ak, sel, nonce)
        result = tpm.verify_quote(
            ak.public, quote, sig, selection=sel, pcrs=agent.read_pcrs(sel), qualifying_data=nonce
        )
    with pytest.raises(PcrPolicyViolation) as exc:
        pcr.enforce(policy, result.pcrs)
    assert "sha256:4" in exc.value.detail
