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
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from tests.admission.upstream.model import Case
from tests.admission.upstream.scenario import Scenario
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


def _documents(name: str) -> list[dict[str, Any]]:
    """The documents of one file of the public test data."""
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
