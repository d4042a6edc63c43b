"""Upstream's sample CRs and the CRs in its documentation, as a user would ``kubectl apply -f``
them (each file or block to a cluster of its own). No upstream test asserts a verdict on these,
so it is derived from upstream's rules; the CRD refuses a few before any webhook runs (a
DeploymentPolicy without ``default`` or ``default.strategy``, ``operator/README.md``'s
``restart_all_services``).

The documents themselves are not in this project: they are read, unedited, from the public test
data (``shared("nodewright")``, each file checked against its manifest), named as its manifest
names them: the file's path, or ``<path>.block<N>.yaml`` for fenced code block N (0-based) of a
Markdown page (``.heredoc.yaml``: the here-document inside that block). Here are only facts: which
files, in which order, and under which provenance. Every one of them is byte for byte the same at
both snapshots (NVIDIA/nodewright 71ca22b8, NVIDIA/skyhook f9b9e8b9: whole files, or the block's
text where the page differs), so both repositories' cases read the same file.

PENDING SHARED DATA (issue 31): ``_PENDING`` below still retypes the seven documents the public
test data does not hold yet (the DeploymentPolicy sample and six blocks of
``docs/deployment_policy.md``). Once those files are added to ``nodewright/`` under the names
that are its keys, they are read from there and the loader refuses to start until the retyped
copy is deleted.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import yaml

from tests.admission.upstream.model import Case
from tests.admission.upstream.objects import budget, compartment, exponential, fixed, linear
from tests.admission.upstream.scenario import Scenario, policy, skyhook
from tests.support.shared_data import shared

DERIVED = "derived from upstream's rules (no upstream test asserts this object)"
DATA = shared("nodewright")

_DP_DOC = "docs/deployment_policy.md"
# (source, the file's name in the public test data), in the order the cases are built.
DOCUMENTS: tuple[tuple[str, str], ...] = (
    ("samples", "operator/config/samples/deploymentpolicy_v1alpha1_deploymentpolicy.yaml"),
    ("samples", "examples/interrupt-wait-for-pod/scr.yaml"),
    ("samples", "examples/simple/scr.yaml"),
    ("samples", "operator/config/samples/interrupt_group.yaml"),
    ("samples", "operator/config/samples/skyhook_v1alpha1_skyhook.yaml"),
    ("docs", "README.md.block2.heredoc.yaml"),
    ("docs", "docs/kyverno/kyverno/README.md.block3.yaml"),
    ("docs", "docs/interrupt_flow.md.block0.yaml"),
    ("docs", f"{_DP_DOC}.block0.yaml"),
    ("docs", f"{_DP_DOC}.block6.yaml"),  # the budget only: the CRD requires default.strategy
    ("docs", f"{_DP_DOC}.block7.yaml"),
    ("docs", f"{_DP_DOC}.block8.yaml"),  # options only: the CRD requires a default
    ("docs", f"{_DP_DOC}.block10.yaml"),  # packages: "# ..." (null)
    ("docs", f"{_DP_DOC}.block12.yaml"),
    # An interrupt type and a package name the CRD and the webhook refuse.
    ("docs", "operator/README.md.block0.yaml"),
)
_BLOCK = re.compile(r"^(?P<path>.+\.md)\.block(?P<n>\d+)(?P<heredoc>\.heredoc)?\.yaml$")


# -- PENDING SHARED DATA: retyped, to be deleted once the public test data holds these files -----


def _pending_sample_policy() -> dict[str, Any]:
    return policy(
        "sample-policy",
        {
            "default": {
                "budget": budget(percent=100),
                "strategy": fixed(initialBatch=1, batchThreshold=100, safetyLimit=50),
            },
            "compartments": [
                compartment(
                    "critical",
                    {"priority": "critical"},
                    budget(count=1),
                    fixed(initialBatch=1, batchThreshold=100, failureThreshold=1, safetyLimit=30),
                ),
                compartment(
                    "production",
                    {"env": "production"},
                    budget(count=3),
                    linear(initialBatch=1, delta=1, batchThreshold=100, failureThreshold=2, safetyLimit=50),
                ),
                compartment(
                    "test",
                    {"env": "test"},
                    budget(percent=50),
                    exponential(initialBatch=2, growthFactor=2, batchThreshold=90, safetyLimit=60),
                ),
            ],
        },
    )


def _pending_my_policy() -> dict[str, Any]:
    grow = exponential(initialBatch=1, growthFactor=2, batchThreshold=100, failureThreshold=1, safetyLimit=50)
    return policy(
        "my-policy",
        {
            "resetBatchStateOnCompletion": True,
            "default": {
                "budget": budget(percent=100),
                "strategy": fixed(initialBatch=1, batchThreshold=100, safetyLimit=50),
            },
            "compartments": [compartment("production", {"env": "production"}, budget(percent=25), grow)],
        },
    )


_PENDING: dict[str, Callable[[], dict[str, Any]]] = {
    "operator/config/samples/deploymentpolicy_v1alpha1_deploymentpolicy.yaml": _pending_sample_policy,
    f"{_DP_DOC}.block0.yaml": _pending_my_policy,
    f"{_DP_DOC}.block6.yaml": lambda: policy(
        "my-policy", {"resetBatchStateOnCompletion": True, "default": {"budget": budget(percent=25)}}
    ),
    f"{_DP_DOC}.block7.yaml": lambda: skyhook(
        "my-skyhook",
        {"deploymentPolicy": "my-policy", "deploymentPolicyOptions": {"resetBatchStateOnCompletion": False}},
    ),
    f"{_DP_DOC}.block8.yaml": lambda: policy("preserve-state-policy", {"resetBatchStateOnCompletion": False}),
    f"{_DP_DOC}.block10.yaml": lambda: skyhook(
        "my-skyhook",
        {
            "deploymentPolicy": "my-policy",
            "deploymentPolicyOptions": {"resetBatchStateOnCompletion": True},
            "nodeSelectors": {"matchLabels": {"workload": "gpu"}},
            "packages": None,
        },
    ),
    f"{_DP_DOC}.block12.yaml": lambda: policy(
        "legacy-equivalent",
        {
            "default": {
                "budget": budget(percent=25),
                "strategy": fixed(initialBatch=1, batchThreshold=100, safetyLimit=50),
            }
        },
    ),
}

# -- end of PENDING SHARED DATA ---------------------------------------------------------------------


def _documents(name: str) -> list[dict[str, Any]]:
    """The documents of one file of the public test data (or, until it is there, its pending copy)."""
    listed = name in DATA.manifest()
    if listed and name in _PENDING:
        raise AssertionError(
            f"{name} is in the public test data now: delete its retyped copy from {__name__}._PENDING"
        )
    if not listed and name in _PENDING:
        return [_PENDING[name]()]
    return [d for d in yaml.safe_load_all(DATA.read(name)) if d is not None]


def _where(name: str) -> tuple[str, str]:
    """(upstream path, the item's prefix) of a file of the public test data."""
    block = _BLOCK.match(name)
    if block is None:
        return name, ""
    kind = "heredoc" if block["heredoc"] else "block"
    return block["path"], f"yaml block {block['n']} ({kind}) "


def load() -> list[tuple[str, str, str, dict[str, Any]]]:
    """(source, path, item, object) for every document, in order."""
    out = []
    for source, name in DOCUMENTS:
        path, prefix = _where(name)
        for i, body in enumerate(_documents(name)):
            item = f"{prefix}document {i} {body['kind']}/{body['metadata']['name']}"
            out.append((source, path, item, body))
    return out


def cases(repo: str) -> list[Case]:
    out: list[Case] = []
    for source, path, item, body in load():
        s = Scenario(repo, source, "", DERIVED)
        s.apply(path, item, body, kubectl=True)
        out += s.cases
    return out
