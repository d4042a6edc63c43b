"""PackagePolicies from the cluster: list, then watch from the list's resourceVersion; 410 and
broken streams re-list. ``policies()`` is None until the first list succeeded (readyz)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from admission.reading.policy import PackagePolicy
from attest import validation
from bootstrap.gate.backoff import failure_delay
from bootstrap.kube import Kube, KubeUnavailable, WatchExpired

# what /readyz and the start-up warning say when the webhook has no policies
NO_POLICY_SOURCE = (
    "no PackagePolicy source: no cluster and no admission.policy_files, so the webhook denies every "
    "package CR (fail closed); set admission.policy_files or run with a cluster"
)
WAITING_FOR_POLICIES = (
    "the webhook is waiting for the first list of PackagePolicies from the cluster "
    "(CRD installed? list/watch on packagepolicies?)"
)

log = logging.getLogger("nodegate.policies")

GROUP, VERSION, PLURAL = "nodegate.io", "v1alpha1", "packagepolicies"


class PolicyWatcher:
    def __init__(self, kube: Kube) -> None:
        self._kube = kube
        self._policies: dict[str, PackagePolicy] | None = None
        self._invalid: dict[str, str] = {}
        self._rv = ""

    def policies(self) -> list[PackagePolicy] | None:
        return None if self._policies is None else list(self._policies.values())

    @property
    def ready(self) -> bool:
        return self._policies is not None

    @property
    def invalid(self) -> Mapping[str, str]:
        """Policies that do not validate (name -> reason). They grant nothing."""
        return dict(self._invalid)

    async def relist(self) -> None:
        items, rv = await self._kube.list_cluster_objects(GROUP, VERSION, PLURAL)
        fresh: dict[str, PackagePolicy] = {}
        self._invalid = {}
        for obj in items:
            self._apply(fresh, "ADDED", obj)
        self._policies, self._rv = fresh, rv

    def _apply(self, into: dict[str, PackagePolicy], kind: str, obj: Mapping[str, Any]) -> None:
        name = str(obj.get("metadata", {}).get("name", ""))
        if kind == "DELETED":
            into.pop(name, None)
            self._invalid.pop(name, None)
            return
        try:
            into[name] = PackagePolicy.model_validate(obj)
            self._invalid.pop(name, None)
        except ValidationError as exc:
            into.pop(name, None)  # an invalid update revokes what the old version granted
            reason = validation.summary(exc, PackagePolicy, 3)
            self._invalid[name] = reason
            log.warning("PackagePolicy %s is invalid and grants nothing: %s", name, reason)

    async def watch_once(self) -> None:
        """Follow the stream until it ends; raises WatchExpired / KubeUnavailable."""
        assert self._policies is not None  # noqa: S101  (relist() first)
        async for event in self._kube.watch_cluster_objects(GROUP, VERSION, PLURAL, self._rv):
            rv = str(event.object.get("metadata", {}).get("resourceVersion", ""))
            if event.type != "BOOKMARK":
                self._apply(self._policies, event.type, event.object)
            if rv:
                self._rv = rv

    async def run(self) -> None:
        """Forever: list, watch, re-list on 410 or failure (with jittered backoff on failures)."""
        failures = 0
        while True:
            try:
                if self._policies is None or not self._rv:
                    await self.relist()
                await self.watch_once()
                failures = 0
            except WatchExpired:
                self._rv = ""  # forces a re-list; the current snapshot stays in force meanwhile
            except KubeUnavailable as exc:
                failures += 1
                delay = failure_delay(failures)  # the exponent capped: a long outage cannot overflow
                log.warning("PackagePolicy watch failed (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
