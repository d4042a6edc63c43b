"""The demo's step 10: a first package CR as a team writes it (the demo's own, in the shape of
NodeWright's simplest example, with no hold toleration), applied to the held node's pool through
nodegate's admission chain, is picked for the
held node by NodeWright (played by the demo: its picker's rule is the gate's
:func:`bootstrap.gate.nodewright.untolerated`), its package completes and the gate releases the
node."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from bootstrap.demo.admit import admit, sample_cr
from bootstrap.demo.manifests import (
    CR_GROUP,
    CR_NAME,
    CR_PLURAL,
    CR_VERSION,
    NODES,
    PACKAGES,
    SAMPLE_POOL,
    TAINT_KEY,
    package_pod,
    review,
)
from bootstrap.demo.narration import DemoFailed, detail, step
from bootstrap.gate.nodewright import parse_cr, show_taint, untolerated
from bootstrap.kube import Kube

_SKYHOOK = ("skyhook.nvidia.com", "v1alpha1", "Skyhook")


async def sample_step(
    kube: Kube, http: aiohttp.ClientSession, url: str, gate_pass: Callable[[], Awaitable[str]]
) -> tuple[list[str], str]:
    """A first package CR, written with no hold toleration: admitted and mutated, picked for the
    held node by NodeWright (played by the demo), its package completes and the node is released."""
    held = NODES[-1]
    cr = sample_cr()
    name = str(cr["metadata"]["name"])
    step(10, f"a package CR written without hold tolerations reaches the held {held} (played: NodeWright)")
    package = next(iter(cr["spec"]["packages"]))
    detail(
        f"Skyhook {name}: one shellscript package ({package}), the shape of NodeWright's simplest "
        "example; applied as written"
    )
    labels = dict(SAMPLE_POOL)
    await kube.patch_node(held, {"metadata": {"labels": labels}})
    label = ",".join(f"{k}={v}" for k, v in labels.items())
    detail(f"$ kubectl label node {held} {label}   (the pool the CR selects)")
    node = await kube.get_node(held)
    taints = tuple(((node or {}).get("spec") or {}).get("taints") or [])
    skipped = untolerated(parse_cr(cr), taints)
    detail(
        "as written, NodeWright would skip it (TaintNotTolerable: "
        f"{', '.join(show_taint(t) for t in skipped) or 'nothing'})"
    )
    if not skipped:
        raise DemoFailed(f"{held} should be held: {taints}")
    done = await admit(http, url, review(cr, "alice", ("ml-platform",), kind=_SKYHOOK))
    shown = [f"{t['key']}={t['value']}:{t['effect']}" for t in done.added]
    untouched = {k: v for k, v in done.obj["spec"].items() if k != "additionalTolerations"} == cr["spec"]
    if len(shown) != 2 or not untouched or done.obj["metadata"] != cr["metadata"]:
        raise DemoFailed(f"the mutating webhook changed more than the hold tolerations: {done.obj}")
    detail(
        f"POST /admission/mutate: JSONPatch adds {len(shown)} tolerations, nothing else: " + ", ".join(shown)
    )
    policy = (done.answer.get("auditAnnotations") or {}).get("policy")
    detail(f"ALLOWED  alice (ml-platform) creates Skyhook {name} (PackagePolicy {policy})")
    await kube.create_cluster_object(*_SKYHOOK[:2], "skyhooks", done.obj)
    detail(f"`nodegate gate --once`: {await gate_pass()}")
    # The operator's picker and its package pod (bootstrap/gate/nodewright.py is the picker's rule).
    stored = await kube.get_cluster_object(*_SKYHOOK[:2], "skyhooks", name)
    if stored is None or untolerated(parse_cr(stored), taints):
        raise DemoFailed(f"NodeWright would still skip {held}: {stored}")
    package = next(iter(stored["spec"]["packages"]))
    pod = package_pod(stored, package, held)
    detail(
        f"NodeWright picks {held}; its package pod {pod['metadata']['name']} carries the CR's "
        f"tolerations ({len(pod['spec']['tolerations'])}), {TAINT_KEY} among them"
    )
    await _complete_on(kube, held, stored)
    detail(f"`nodegate gate --once`: {await gate_pass()}")
    after = await kube.get_node(held)
    hold = next(
        (t for t in ((after or {}).get("spec") or {}).get("taints") or [] if t.get("key") == TAINT_KEY), None
    )
    if hold is not None:
        raise DemoFailed(f"{held} should be released once its packages completed: held {hold}")
    detail(f"{held}: released: hold taint removed; packages of {CR_NAME} and {name} complete")
    return shown, held


async def _complete_on(kube: Kube, held: str, sample: dict[str, Any]) -> None:
    """NodeWright (played) runs the sample CR's packages on ``held`` and retries gpu-stack's failed
    driver there: everything complete, written to the Node and to each CR's status."""
    name = str(sample["metadata"]["name"])
    states = {
        f"{p}|{v['version']}": {
            "name": p, "version": v["version"], "image": v["image"],
            "stage": "config", "state": "complete",
        }
        for p, v in sample["spec"]["packages"].items()
    }  # fmt: skip
    ours = {
        f"{p}|{v}": {
            "name": p, "version": v, "image": f"ghcr.io/nvidia/nodewright-packages/{p}",
            "stage": "post-interrupt", "state": "complete",
        }
        for p, v in PACKAGES.items()
    }  # fmt: skip
    annotations = {
        f"skyhook.nvidia.com/nodeState_{name}": json.dumps(states, sort_keys=True),
        f"{CR_GROUP}/nodeState_{CR_NAME}": json.dumps(ours, sort_keys=True),
    }
    await kube.patch_node(held, {"metadata": {"annotations": annotations}})
    await kube.patch_cluster_object(
        *_SKYHOOK[:2], "skyhooks", name, {"status": {"nodeState": {held: states}}}, status=True
    )
    current = await kube.get_cluster_object(CR_GROUP, CR_VERSION, CR_PLURAL, CR_NAME)
    before = ((current or {}).get("status") or {}).get("nodeState", {}).get(held, {})
    replaced = {**{k: None for k in before}, **ours}  # a merge patch: the node's map replaced whole
    await kube.patch_cluster_object(
        CR_GROUP, CR_VERSION, CR_PLURAL, CR_NAME, {"status": {"nodeState": {held: replaced}}}, status=True
    )
    detail(f"NodeWright's agent (played) reports {name}'s and {CR_NAME}'s packages complete on {held}")
