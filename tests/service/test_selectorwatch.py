"""The package CRs' selectors the webhook judges a node's own label changes against (issue 33,
finding 4): listed and watched from the cluster (kmock), status skipped, fail closed until listed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from admission.hold.selection import PackageSelector, selector_matches
from bootstrap.config import Settings
from bootstrap.kube import Kube
from bootstrap.service.compose import _decider
from bootstrap.service.webhook.selectorwatch import SelectorDecoder, SelectorWatcher
from tests.support.kshim import ShimEmulator

pytestmark = pytest.mark.kmock(cls=ShimEmulator)

NW = "nodewright.nvidia.com/v1alpha1/nodewrights"
GPU = {"matchLabels": {"nvidia.com/gpu.product": "H100"}}


def nodewright(name: str, selector: Any, status: Any = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "nodewright.nvidia.com/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": name, "resourceVersion": "7"},
        "spec": {"nodeSelectors": selector, "packages": {}},
    }
    if status is not None:
        doc["status"] = status
    return doc


@pytest.fixture
async def kube(kmock: Any) -> Any:
    k = Kube.for_host(str(kmock.url), timeout=2.0)
    yield k
    await k.close()


def test_the_decoder_reads_name_and_selector_and_skips_the_status() -> None:
    status = {"nodeState": {f"n{i}": {"p|1": {"state": "complete"}} for i in range(1000)}}
    raw = json.dumps(nodewright("drivers", GPU, status)).encode()
    assert SelectorDecoder().from_json(raw) == ("drivers", "7", GPU)
    # A spec that is not an object: kept so that selector_matches reads it as "every node".
    odd = json.dumps({**nodewright("odd", GPU), "spec": "x"}).encode()
    name, _rv, selector = SelectorDecoder().from_json(odd)
    assert name == "odd"
    assert selector_matches(selector, {})
    assert selector_matches(selector, {"any": "thing"})
    bookmark = json.dumps({"kind": "NodeWright", "metadata": {"resourceVersion": "9"}}).encode()
    assert SelectorDecoder().from_json(bookmark) == ("", "9", None)


async def test_fail_closed_until_both_groups_are_listed(kmock: Any, kube: Kube) -> None:
    kmock.resources[NW] = {"kind": "NodeWright", "namespaced": False}
    kmock.objects[NW, None, "drivers"] = nodewright("drivers", GPU)
    watcher = SelectorWatcher(kube)
    assert watcher.package_selectors() is None
    await watcher.relist("nodewright.nvidia.com")
    assert watcher.package_selectors() is None  # skyhooks not listed yet
    await watcher.relist("skyhook.nvidia.com")  # not served here: no Skyhooks select anything
    assert watcher.package_selectors() == (PackageSelector("nodewright.nvidia.com/drivers", GPU),)
    assert watcher.ready


async def test_the_watch_follows_selector_changes_and_deletes(kmock: Any, kube: Kube) -> None:
    kmock.resources[NW] = {"kind": "NodeWright", "namespaced": False}
    kmock.objects[NW, None, "drivers"] = nodewright("drivers", GPU)
    watcher = SelectorWatcher(kube)
    await watcher.relist("nodewright.nvidia.com")
    await watcher.relist("skyhook.nvidia.com")
    first = watcher.package_selectors()
    task = asyncio.create_task(watcher.watch_once("nodewright.nvidia.com"))
    from kmock._internal import enums
    from kubernetes_asyncio import client as kc

    for _ in range(200):  # kmock replays current objects, not history: mutate once the watch is open
        if len(kmock[enums.action.WATCH]):
            break
        await asyncio.sleep(0.01)
    custom = kc.CustomObjectsApi(kube._api)
    other = {"matchLabels": {"pool": "cpu"}}
    await custom.create_cluster_custom_object(
        "nodewright.nvidia.com", "v1alpha1", "nodewrights", nodewright("tuning", other)
    )
    await custom.delete_cluster_custom_object("nodewright.nvidia.com", "v1alpha1", "nodewrights", "drivers")
    want = (PackageSelector("nodewright.nvidia.com/tuning", other),)
    for _ in range(200):  # the stream is asynchronous: wait for the events, bounded
        if watcher.package_selectors() == want:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    assert watcher.package_selectors() == want
    assert first == (PackageSelector("nodewright.nvidia.com/drivers", GPU),)


def test_the_service_wires_the_watch_and_the_operators_into_the_decider(kube: Kube) -> None:
    settings = Settings.model_validate(
        {"trust_domain": "example.org", "admission": {"operator_users": ["system:serviceaccount:nw:op"]}}
    )
    decider, _ready = _decider(settings, kube)
    assert isinstance(decider.selector_source, SelectorWatcher)
    assert decider.operators == frozenset({"system:serviceaccount:nw:op"})
    default, _ = _decider(Settings.model_validate({"trust_domain": "example.org"}), None)
    assert default.selector_source is None  # no cluster: a node's label changes are refused
    assert "system:serviceaccount:nodewright:nodewright-controller-manager" in default.operators
