"""Upstream's chainsaw e2e tests (``k8s-tests/chainsaw/``), replayed from upstream's own files.

Each test's ``chainsaw-test.yaml`` and the CRs it applies are read, unedited, from the public test
data (``shared("nodewright-e2e")``, named ``<repository>/<path>``, each file checked against its
manifest). Its steps run in order on one :class:`Scenario`: ``apply``/``create``/``update``/``patch``
of a file or an inline resource, and ``delete`` of a file or a reference, for every Skyhook and
DeploymentPolicy they touch (a step without a name is chainsaw's ``step-<i>``). What this module
keeps are facts: which tests the corpus replays, and what the few scripts that change a CR do
(:data:`SCRIPTS`: the command, as upstream writes it, and its effect, with upstream's refusal where
the test expects one). Every step here succeeds upstream (the e2e test would fail otherwise),
except the scripts that expect a refusal (``kubectl ... 2>err.txt`` then ``[ $ec -eq 0 ]`` fails).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from tests.admission.upstream.model import NODEWRIGHT, SKYHOOK
from tests.admission.upstream.scenario import Scenario
from tests.support.shared_data import shared

DATA = shared("nodewright-e2e")
KINDS = ("Skyhook", "DeploymentPolicy")
PAUSE, DISABLE = "skyhook.nvidia.com/pause", "skyhook.nvidia.com/disable"
BOTH, N_ONLY, S_ONLY = (NODEWRIGHT, SKYHOOK), (NODEWRIGHT,), (SKYHOOK,)

# The tests the corpus replays, and which snapshots have them.
TESTS: dict[str, tuple[str, ...]] = {
    "skyhook/auto-taint-new-nodes": BOTH,
    "skyhook/cleanup-pods": BOTH,
    "skyhook/config-skyhook": BOTH,
    "skyhook/delete-blocked-when-disabled": N_ONLY,
    "skyhook/delete-blocked-when-paused": N_ONLY,
    "skyhook/delete-skyhook": BOTH,
    "skyhook/depends-on": BOTH,
    "skyhook/downgrade-after-uninstall": N_ONLY,
    "skyhook/downgrade-enabled-false-preserves-state": N_ONLY,
    "skyhook/explicit-uninstall": N_ONLY,
    "skyhook/failure-skyhook": BOTH,
    "skyhook/interrupt-grouping": BOTH,
    "skyhook/interrupt": BOTH,
    "skyhook/malformed-node-state": N_ONLY,
    "skyhook/package-upgrade": N_ONLY,
    "skyhook/runtime-required": BOTH,
    "skyhook/simple-skyhook": BOTH,
    "skyhook/simple-update-skyhook": BOTH,
    "skyhook/skyhook-upgrade": BOTH,
    "skyhook/strict-order": BOTH,
    "skyhook/taint-scheduling": BOTH,
    "skyhook/uninstall-cancel": N_ONLY,
    "skyhook/uninstall-cancel-during-interrupt": N_ONLY,
    "skyhook/uninstall-fix-config": N_ONLY,
    "skyhook/uninstall-mixed-packages": N_ONLY,
    "skyhook/uninstall-on-delete": N_ONLY,
    "skyhook/uninstall-upgrade-skyhook": S_ONLY,
    "skyhook/validate-packages": BOTH,
    "cli/deployment-policy": BOTH,
    "cli/lifecycle": BOTH,
    "cli/node": BOTH,
    "cli/package": BOTH,
    "cli/reset": BOTH,
    "deployment-policy/batch-state-reset": BOTH,
    "deployment-policy/legacy-compatibility": BOTH,
    "deployment-policy/linear-strategy": BOTH,
    "deployment-policy/multi-compartment": BOTH,
    "deployment-policy/overlapping-selectors": BOTH,
    "helm/helm-chart-test": BOTH,
    "helm/helm-webhook-test": BOTH,
}


@dataclass(frozen=True)
class Script:
    """What one command of a test's script does to a CR (the other commands change none).

    ``at`` is the script's place (``<step> / try[<i>]``), ``command`` the command as the script has
    it (whitespace aside; the script holds it, or the replay stops); ``action`` one of
    ``annotate`` (``changes``: annotation -> value, None removes it; the CLI's pause/resume/
    disable/enable patch the annotation: ``SetSkyhookAnnotation``/``RemoveSkyhookAnnotation`` in
    ``operator/internal/cli/utils/utils.go``), ``delete`` (``held``: a finalizer keeps the object,
    terminating), ``apply`` (``kubectl apply -f`` of ``file``) or ``patch`` (a merge patch)."""

    at: str
    command: str
    action: str
    kind: str = "Skyhook"
    name: str = ""
    changes: dict[str, str | None] = field(default_factory=dict)
    file: str = ""
    patch: dict[str, Any] = field(default_factory=dict)
    deny: str = ""
    held: bool = False
    repos: tuple[str, ...] = BOTH


def _annotate(at: str, name: str, command: str, changes: dict[str, str | None]) -> Script:
    return Script(at, command, "annotate", name=name, changes=changes)


def _gate(name: str, gate: str, first: str, then: str) -> list[Script]:
    """Pause (or disable) the CR, delete it, then resume: the operator's finalizer keeps the CR
    (condition DeletionBlocked) until the uninstalls can run. Every step is allowed upstream."""
    prefix = f"kubectl annotate skyhook {name}    "
    return [
        _annotate(f"{first} / try[0]", name, f"{prefix}{gate}=true --overwrite", {gate: "true"}),
        Script(
            f"{first} / try[1]", f"kubectl delete skyhook {name} --wait=false", "delete", name=name, held=True
        ),
        _annotate(f"{then} / try[0]", name, f"{prefix}{gate}- --overwrite", {gate: None}),
    ]


def _cli(at: str, verb: str, changes: dict[str, str | None]) -> Script:
    return _annotate(at, "cli-lifecycle-test", f"../skyhook-cli {verb} cli-lifecycle-test", changes)


def _apply(at: str, file: str, deny: str, repos: tuple[str, ...] = BOTH) -> Script:
    return Script(at, f"kubectl apply -f {file} 2>err.txt", "apply", file=file, deny=deny, repos=repos)


_UNINSTALL_DENY = 'package "mypkg": '
SCRIPTS: dict[str, list[Script]] = {
    "skyhook/delete-blocked-when-disabled": _gate(
        "delete-blocked-when-disabled", DISABLE, "disable-then-delete", "reenable-drains-finalizer"
    ),
    "skyhook/delete-blocked-when-paused": _gate(
        "delete-blocked-when-paused", PAUSE, "pause-then-delete", "unpause-drains-finalizer"
    ),
    "skyhook/uninstall-on-delete": [
        Script(
            "delete-cr / try[0]",
            "kubectl delete skyhook uninstall-on-delete --wait=false",
            "delete",
            name="uninstall-on-delete",
            held=True,
        )
    ],
    "cli/lifecycle": [
        _cli("test-pause / try[0]", "pause", {PAUSE: "true"}),
        _cli("test-resume / try[0]", "resume", {PAUSE: None}),
        _cli("test-disable / try[0]", "disable", {DISABLE: "true"}),
        _cli("test-enable / try[0]", "enable", {DISABLE: None}),
        _cli("test-pause-and-disable / try[0]", "pause", {PAUSE: "true"}),
        _cli("test-pause-and-disable / try[0]", "disable", {DISABLE: "true"}),
        _cli("test-pause-and-disable / try[2]", "resume", {PAUSE: None}),
        _cli("test-pause-and-disable / try[4]", "enable", {DISABLE: None}),
        Script(
            "cleanup / try[0]",
            "kubectl delete skyhook cli-lifecycle-test 2>/dev/null || true",
            "delete",
            name="cli-lifecycle-test",
        ),
    ],
    "deployment-policy/batch-state-reset": [
        Script(
            "cleanup-test-1 / try[0]",
            "kubectl delete skyhook test-auto-reset-enabled --ignore-not-found --wait=true",
            "delete",
            name="test-auto-reset-enabled",
        )
    ],
    "helm/helm-webhook-test": [
        _apply(
            "step-1 / try[4]",
            "invalid-skyhook.yaml",
            "error trying to validate skyhook spec graph is invalid: error graph is not valid, "
            "missing: [milkshake|1.2.3]",
        ),
        _apply(
            "step-1 / try[5]",
            "invalid-deploymentpolicy.yaml",
            'compartment name "duplicate-name" is not unique',
        ),
        _apply(
            "step-1 / try[6]",
            "skyhook-missing-policy.yaml",
            'deploymentPolicy "non-existent-policy" not found',
        ),
        Script(
            "step-1 / try[9]",
            "kubectl patch skyhook skyhook-valid-policy --type=merge "
            """-p '{"spec":{"deploymentPolicy":"does-not-exist"}}' 2>err.txt""",
            "patch",
            name="skyhook-valid-policy",
            patch={"spec": {"deploymentPolicy": "does-not-exist"}},
            deny='deploymentPolicy "does-not-exist" not found',
        ),
        Script(
            "step-1 / try[10]",
            "kubectl delete deploymentpolicy test-policy 2>err.txt",
            "delete",
            kind="DeploymentPolicy",
            name="test-policy",
            deny=(
                'cannot delete DeploymentPolicy "test-policy": still referenced by 1 Skyhook(s): '
                "[skyhook-valid-policy]"
            ),
        ),
        Script(
            "step-1 / try[11]",
            "kubectl delete skyhook skyhook-valid-policy",
            "delete",
            name="skyhook-valid-policy",
        ),
        Script(
            "step-1 / try[11]",
            "kubectl delete deploymentpolicy test-policy",
            "delete",
            kind="DeploymentPolicy",
            name="test-policy",
        ),
        _apply(
            "step-1 / try[12]",
            "skyhook-apply-without-enabled.yaml",
            f"{_UNINSTALL_DENY}uninstall.apply requires uninstall.enabled to be true",
            N_ONLY,
        ),
        # kubectl apply onto an object it did not create: the manifest merged in, its `packages:`
        # (null) removes them all.
        _apply(
            "step-1 / try[15]",
            "update-remove-enabled-pkg.yaml",
            'package "mypkg" has uninstall.enabled=true; set uninstall.apply=true and wait for '
            "completion before removing from spec",
            N_ONLY,
        ),
        _apply(
            "step-1 / try[16]",
            "update-downgrade-enabled-pkg.yaml",
            f"{_UNINSTALL_DENY}downgrade not allowed \u2014 set uninstall.apply=true first, wait "
            "for uninstall to complete, then change version",
            N_ONLY,
        ),
        Script(
            "step-1 / try[17]",
            "kubectl delete skyhook uninstall-webhook-reject --timeout=120s || true",
            "delete",
            name="uninstall-webhook-reject",
            repos=N_ONLY,
        ),
    ],
}


def _flat(text: str) -> str:
    """A script's text with line continuations joined and whitespace runs made one space."""
    return " ".join(text.replace("\\\n", " ").split())


def _documents(repo: str, path: str) -> list[dict[str, Any]]:
    raw = DATA.read(f"{repo}/{path}")
    return [d for d in yaml.safe_load_all(raw) if isinstance(d, dict)]


def _ours(doc: dict[str, Any]) -> bool:
    return doc.get("kind") in KINDS


def replay(s: Scenario, repo: str, test: str) -> None:
    """Run one test's steps on ``s`` (its prefix is the test's folder)."""
    folder = f"k8s-tests/chainsaw/{test}/"
    (spec,) = [d["spec"] for d in _documents(repo, folder + "chainsaw-test.yaml") if d.get("kind") == "Test"]
    scripts = [x for x in SCRIPTS.get(test, []) if repo in x.repos]
    found: list[Script] = []
    for i, step in enumerate(spec["steps"]):
        name = step.get("name") or f"step-{i}"
        for j, entry in enumerate(step.get("try") or []):
            at = f"{name} / try[{j}]"
            for op in ("apply", "create", "update", "patch", "delete"):
                if op in entry:
                    _operation(s, repo, folder, at, op, entry[op])
            content = _flat((entry.get("script") or {}).get("content", ""))
            for script in (x for x in scripts if x.at == at):
                assert _flat(script.command) in content, f"{repo} {test} {at}: no {script.command!r}"
                _script(s, repo, folder, f"{at} script: {script.command}", script)
                found.append(script)
    missing = [x.command for x in scripts if x not in found]
    assert not missing, f"{repo} {test}: no such step for {missing}"


def _operation(s: Scenario, repo: str, folder: str, at: str, op: str, what: dict[str, Any]) -> None:
    if "file" in what:
        path, docs = what["file"], _documents(repo, folder + what["file"])
    elif "resource" in what:
        path, docs = "chainsaw-test.yaml", [what["resource"]]
    else:
        path, docs = "chainsaw-test.yaml", [{"kind": what["ref"].get("kind"), "metadata": what["ref"]}]
    for doc in filter(_ours, docs):
        kind, name = doc["kind"], doc["metadata"]["name"]
        item = f"{at} {op} {kind}/{name}"
        if op == "delete":
            if (kind, name) in s.store:  # a DELETE of an absent object is answered 404, unadmitted
                s.delete(path, item, kind, name)
        elif op == "patch":
            s.patch(path, item, kind, name, doc)
        else:
            getattr(s, op)(path, item, doc)


def _script(s: Scenario, repo: str, folder: str, item: str, script: Script) -> None:
    path = "chainsaw-test.yaml"
    if script.action == "annotate":
        s.annotate(path, item, script.name, script.changes)
    elif script.action == "delete":
        s.delete(path, item, script.kind, script.name, script.deny, held=script.held)
    elif script.action == "patch":
        s.patch(path, item, script.kind, script.name, script.patch, script.deny)
    else:
        for doc in filter(_ours, _documents(repo, folder + script.file)):
            s.apply(script.file, item, doc, script.deny, kubectl=True)


def scenario(repo: str, test: str) -> Scenario:
    """One test of :data:`TESTS`, replayed from the repository's files."""
    s = Scenario(repo, "chainsaw", f"k8s-tests/chainsaw/{test}/", "chainsaw step", label=test)
    replay(s, repo, test)
    return s


def scenarios(repo: str) -> list[Scenario]:
    return [scenario(repo, test) for test, repos in TESTS.items() if repo in repos]


__all__ = ["SCRIPTS", "TESTS", "scenario", "scenarios"]
