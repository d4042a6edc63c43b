"""The chart's CRDs (charts/nodegate/crds/) against the Kubernetes API's own schema, the structural
schema rules, and what the code really writes and reads: NodeAttestations as bootstrap/store_kube.py
and Gate.attestation_status produce them, PackagePolicies as admission/reading/policy.py parses them.

The apiserver is not available here, so its schema validation is stood in for by jsonschema over the
openAPIV3Schema, converted (``nullable``) and tightened so that a field the apiserver would silently
prune fails loudly instead (``additionalProperties: false`` wherever the schema lists properties)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, get_args

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from pydantic import BaseModel, ValidationError

from admission.reading import policy as pol
from attest.tpm import Counters
from bootstrap import store as store_mod
from bootstrap.config import GateSettings
from bootstrap.gate import Gate, holds
from bootstrap.kube import Conflict, Kube, NotFound
from bootstrap.store import Attestation, NodeRecord
from bootstrap.store.kube import KubeStore

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "charts" / "nodegate" / "crds"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
EK = "ab" * 32


# -- loading --------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML keeps the last one silently)."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    keys = [loader.construct_object(k, deep=deep) for k, _v in node.value]
    dupes = {k for k in keys if keys.count(k) > 1}
    if dupes:
        raise yaml.constructor.ConstructorError(
            None, None, f"duplicate keys {sorted(dupes)}", node.start_mark
        )
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load_crd(name: str) -> dict[str, Any]:
    text = (CRDS / name).read_text()
    docs = [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]
    assert len(docs) == 1, f"{name}: expected one document, got {len(docs)}"
    doc = docs[0]
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def na_crd() -> dict[str, Any]:
    return load_crd("nodeattestations.yaml")


@pytest.fixture(scope="module")
def pp_crd() -> dict[str, Any]:
    return load_crd("packagepolicies.yaml")


def version_of(crd: dict[str, Any]) -> dict[str, Any]:
    versions = crd["spec"]["versions"]
    assert len(versions) == 1
    v = versions[0]
    assert isinstance(v, dict)
    return v


def schema_of(crd: dict[str, Any]) -> dict[str, Any]:
    s = version_of(crd)["schema"]["openAPIV3Schema"]
    assert isinstance(s, dict)
    return s


# -- OpenAPI (Kubernetes dialect) -> JSON Schema ----------------------------------------------------


def to_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """``nullable: true`` -> a null alternative; x-kubernetes-* dropped; objects with listed
    properties closed (the apiserver would prune anything else, which here is a failure)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "description"):
            continue
        if key == "properties":
            out[key] = {k: to_json_schema(v) for k, v in value.items()}
        elif key in ("items", "not") or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = to_json_schema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_json_schema(v) for v in value]
        else:
            out[key] = value
    if "properties" in node and "additionalProperties" not in node:
        out["additionalProperties"] = False
    if node.get("nullable") is True:
        out["type"] = [node["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


def _date_time(value: object) -> bool:
    """RFC 3339 as the apiserver accepts it: date, "T", time, and a zone ("Z" or an offset)."""
    if not isinstance(value, str):
        return True
    if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", value):
        raise ValueError(f"{value!r} is not RFC 3339")
    datetime.fromisoformat(value.replace("Z", "+00:00"))
    return True


FORMATS = jsonschema.FormatChecker(formats=())
FORMATS.checks("date-time", raises=ValueError)(_date_time)


def validator(crd: dict[str, Any]) -> jsonschema.Draft7Validator:
    schema = to_json_schema(schema_of(crd))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema, format_checker=FORMATS)


def errors(crd: dict[str, Any], obj: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(crd).iter_errors(obj)]


# -- the CRDs as Kubernetes objects ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["nodeattestations.yaml", "packagepolicies.yaml"])
def test_valid_crd_for_newest_kubernetes(name: str) -> None:
    crd = load_crd(name)
    newest = kubernetes_validate.latest_version()
    checked = kubernetes_validate.validate(crd, newest, strict=True)
    assert checked == ".".join(newest.split(".")[:2])


def test_strict_validation_catches_a_typo(na_crd: dict[str, Any]) -> None:
    """Guards the test above: strict mode would notice a misspelt schema keyword."""
    bad = copy.deepcopy(na_crd)
    schema_of(bad)["properties"]["spec"]["propertys"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, kubernetes_validate.latest_version(), strict=True)


def test_nodeattestation_names(na_crd: dict[str, Any]) -> None:
    assert na_crd["metadata"]["name"] == "nodeattestations.nodegate.io"
    spec = na_crd["spec"]
    assert spec["group"] == "nodegate.io"
    assert spec["scope"] == "Cluster"
    assert spec["names"] == {
        "kind": "NodeAttestation",
        "listKind": "NodeAttestationList",
        "plural": "nodeattestations",
        "singular": "nodeattestation",
        "shortNames": ["na"],
    }
    v = version_of(na_crd)
    assert (v["name"], v["served"], v["storage"]) == ("v1alpha1", True, True)
    assert v["subresources"] == {"status": {}}


def test_packagepolicy_names(pp_crd: dict[str, Any]) -> None:
    assert pp_crd["metadata"]["name"] == "packagepolicies.nodegate.io"
    spec = pp_crd["spec"]
    assert (spec["group"], spec["scope"]) == ("nodegate.io", "Cluster")
    assert spec["names"]["kind"] == "PackagePolicy"
    assert (spec["names"]["plural"], spec["names"]["singular"]) == ("packagepolicies", "packagepolicy")
    v = version_of(pp_crd)
    assert (v["name"], v["served"], v["storage"]) == ("v1alpha1", True, True)
    assert "subresources" not in v  # nothing writes a PackagePolicy status


def test_nodeattestation_printer_columns(na_crd: dict[str, Any]) -> None:
    columns = [(c["name"], c["jsonPath"], c["type"]) for c in version_of(na_crd)["additionalPrinterColumns"]]
    assert columns == [
        ("Phase", ".status.phase", "string"),
        ("Reason", ".status.reason", "string"),
        ("SPIFFE-ID", ".spec.spiffeId", "string"),
        ("Attested", ".status.attestedAt", "date"),
        ("Age", ".metadata.creationTimestamp", "date"),
    ]


def _resolve(schema: dict[str, Any], json_path: str) -> dict[str, Any]:
    node = schema
    for part in json_path.lstrip(".").split("."):
        node = node["properties"][part]
    return node


def test_packagepolicy_printer_columns(pp_crd: dict[str, Any]) -> None:
    columns = version_of(pp_crd)["additionalPrinterColumns"]
    assert columns[-1] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    schema = schema_of(pp_crd)
    for c in columns[:-1]:  # every other column shows a boolean limit that exists in the schema
        assert c["type"] == "boolean"
        assert _resolve(schema, c["jsonPath"])["type"] == "boolean"


# -- structural schema ----------------------------------------------------------------------------

_JUNCTOR_KEYS = {
    "required", "enum", "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "multipleOf",
    "uniqueItems", "properties", "items", "allOf", "anyOf", "oneOf", "not",
}  # fmt: skip


def structural_problems(node: dict[str, Any], path: str = "") -> Iterator[str]:
    """The apiserver's structural-schema rules (the subset a hand-written schema can break)."""
    free = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
    if not node.get("type") and not free:
        yield f"{path or '<root>'}: no type"
    if "properties" in node and "additionalProperties" in node:
        yield f"{path}: properties and additionalProperties together"
    if node.get("type") == "array" and not isinstance(node.get("items"), dict):
        yield f"{path}: an array needs one items schema"
    for key, sub in node.get("properties", {}).items():
        yield from structural_problems(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from structural_problems(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from structural_problems(node["additionalProperties"], f"{path}{{}}")
    for junctor in ("allOf", "anyOf", "oneOf"):
        for branch in node.get(junctor, []):
            yield from _junctor_problems(node, branch, f"{path}.{junctor}")
    if "not" in node:
        yield from _junctor_problems(node, node["not"], f"{path}.not")


def _junctor_problems(parent: dict[str, Any], branch: dict[str, Any], path: str) -> Iterator[str]:
    for key in set(branch) - _JUNCTOR_KEYS:
        yield f"{path}: {key} is not allowed inside a junctor"
    for key in branch.get("properties", {}):
        if key not in parent.get("properties", {}):
            yield f"{path}: property {key} is not declared outside the junctor"


@pytest.mark.parametrize("name", ["nodeattestations.yaml", "packagepolicies.yaml"])
def test_schema_is_structural(name: str) -> None:
    schema = schema_of(load_crd(name))
    assert list(structural_problems(schema)) == []
    assert schema["type"] == "object"
    assert schema["properties"]["metadata"] == {"type": "object"}  # metadata may not be restricted
    for top in ("spec", "status"):
        if top in schema["properties"]:
            assert "x-kubernetes-preserve-unknown-fields" not in schema["properties"][top]


def test_structural_check_finds_problems() -> None:
    bad = {
        "type": "object",
        "properties": {
            "a": {"type": "array"},
            "b": {"properties": {}},
            "c": {"type": "object", "properties": {"x": {"type": "string"}}, "oneOf": [{"type": "string"}]},
        },
    }
    assert sorted(structural_problems(bad)) == [
        ".a: an array needs one items schema",
        ".b: no type",
        ".c.oneOf: type is not allowed inside a junctor",
    ]


def test_converter_handles_nullable() -> None:
    conv = to_json_schema({"type": "object", "properties": {"s": {"type": "string", "nullable": True}}})
    assert conv == {
        "type": "object",
        "properties": {"s": {"type": ["string", "null"]}},
        "additionalProperties": False,
    }


# -- NodeAttestation: what the code writes --------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the apiserver applies application/merge-patch+json."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class MemoryKube(Kube):
    """The NodeAttestation calls of Kube over a dict, with the apiserver's resourceVersion checks
    and status-subresource split; every stored version is kept so each stage can be checked."""

    objects: dict[str, dict[str, Any]]
    history: list[dict[str, Any]]
    rv: int

    def _reset(self) -> None:
        self.objects, self.history, self.rv, self.leases = {}, [], 0, {}

    def _store(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[obj["metadata"]["name"]] = obj
        self.history.append(copy.deepcopy(obj))
        return copy.deepcopy(obj)

    leases: dict[str, dict[str, Any]]

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        if body["metadata"]["name"] in self.leases:  # the store's EK claims
            raise Conflict("exists")
        self.leases[body["metadata"]["name"]] = copy.deepcopy(body)
        return copy.deepcopy(body)

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        lease = self.leases.get(name)
        return copy.deepcopy(lease) if lease is not None else None

    async def delete_lease(self, namespace: str, name: str) -> None:
        self.leases.pop(name, None)

    async def get_cluster_object(
        self, group: str, version: str, plural: str, name: str
    ) -> dict[str, Any] | None:
        obj = self.objects.get(name)
        return copy.deepcopy(obj) if obj is not None else None

    async def list_cluster_objects(
        self, group: str, version: str, plural: str, *, label_selector: str | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        items = list(self.objects.values())
        if label_selector:
            key, _, value = label_selector.partition("=")
            items = [o for o in items if o["metadata"].get("labels", {}).get(key) == value]
        return copy.deepcopy(items), str(self.rv)

    async def create_cluster_object(
        self, group: str, version: str, plural: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        if body["metadata"]["name"] in self.objects:
            raise Conflict("exists")
        obj = {k: v for k, v in copy.deepcopy(body).items() if k != "status"}  # status: subresource only
        return self._store(obj)

    async def patch_cluster_object(
        self,
        group: str,
        version: str,
        plural: str,
        name: str,
        patch: dict[str, Any],
        *,
        status: bool = False,
    ) -> dict[str, Any]:
        current = self.objects.get(name)
        if current is None:
            raise NotFound(name)
        rv = patch.get("metadata", {}).get("resourceVersion")
        if rv is not None and rv != current["metadata"]["resourceVersion"]:
            raise Conflict("stale resourceVersion")
        patched = merge_patch(current, patch)
        kept = "spec" if status else "status"  # each endpoint ignores the other's half
        if kept in current:
            patched[kept] = copy.deepcopy(current[kept])
        else:
            patched.pop(kept, None)
        if status:
            patched["metadata"] = copy.deepcopy(current["metadata"])
        return self._store(patched)


@pytest.fixture
async def kube() -> AsyncIterator[MemoryKube]:
    k = MemoryKube.for_host("http://127.0.0.1:9")  # never contacted: every call used is overridden
    assert isinstance(k, MemoryKube)
    k._reset()
    yield k
    await k.close()


def _attestation(node: str = "gpu-1", at: datetime = T0, serial: str = "1f") -> Attestation:
    return Attestation(
        node_name=node,
        ek_sha256=EK,
        ak_public=b"\x00\x10ak-public",
        spiffe_id=f"spiffe://example.org/node/{node}",
        counters=Counters(3, 1, 123456),
        svid_serial=serial,
        attested_at=at,
        expires_at=at + timedelta(hours=1),
        boot_id="8c1f0b7e-2f6d-4b4f-9c1a-0e5d2a9b7c31",
        measured_boot_class="fleet",
    )


def _allow(_existing: NodeRecord | None) -> None:
    return None


async def test_store_kube_objects_conform(kube: MemoryKube, na_crd: dict[str, Any]) -> None:
    """Every version store_kube stores, through join, renewal, revoke, unrevoke and forget."""
    store = KubeStore(kube, clock=lambda: T0)
    for i, action in enumerate(["join", "renew"]):
        await store.commit(
            _attestation(at=T0 + timedelta(minutes=i), serial=f"{i + 10:x}"),
            session_id=f"session-{i}",
            session_expires_at=T0 + timedelta(minutes=i + 1),
            action=action,
            check=_allow,
        )
    joined = copy.deepcopy(kube.objects["gpu-1"])
    await store.revoke("gpu-1", actor="admin@example.org", reason="lost")
    await store.revoke("gpu-1", actor="admin@example.org", reason="found", revoked=False)
    assert await store.forget("gpu-1", actor="admin@example.org", reason="decommissioned")

    assert joined["spec"] == {"ekSha256": EK, "spiffeId": "spiffe://example.org/node/gpu-1", "revoked": False}
    assert set(joined["status"]) == {"attestedAt", "expiresAt", "bootID", "resetCount"}
    assert (joined["status"]["bootID"], joined["status"]["resetCount"]) == (
        "8c1f0b7e-2f6d-4b4f-9c1a-0e5d2a9b7c31",
        3,
    )
    stages = {tuple(sorted(o)) for o in kube.history}
    assert ("apiVersion", "kind", "metadata", "spec") in stages  # created before the status is published
    assert kube.objects["gpu-1"]["spec"] == {}  # a tombstone
    assert len(kube.history) >= 7
    for obj in kube.history:
        assert errors(na_crd, obj) == [], obj


GateStatus = Callable[[holds.Decision, dict[str, Any], datetime], dict[str, Any]]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
async def gate_status() -> AsyncIterator[GateStatus]:
    """Gate.attestation_status at a chosen time (it never calls the API)."""
    clock = Clock()
    kube = Kube.for_host("http://127.0.0.1:9")
    gate = Gate(kube, GateSettings(), events_namespace="nodegate", now=clock, identity="test")

    def status(decision: holds.Decision, current: dict[str, Any], now: datetime) -> dict[str, Any]:
        clock.now = now
        return gate.attestation_status(decision, current)

    yield status
    await kube.close()


def _node(stage: str | None, state: str | None) -> dict[str, Any]:
    annotations = {}
    if stage is not None:
        entry = {"name": "dexter", "version": "1.2.3", "image": "x", "stage": stage, "state": state}
        annotations["nodewright.nvidia.com/nodeState_drivers"] = json.dumps({"dexter|1.2.3": entry})
    return {"metadata": {"name": "gpu-1", "labels": {"pool": "gpu"}, "annotations": annotations}}


def _cr(node: dict[str, Any]) -> holds.PackageCr:
    """The NodeWright CR whose status reports what the node's annotation says (the operator
    mirrors its state into status.nodeState: the two agree)."""
    raw = node["metadata"]["annotations"].get("nodewright.nvidia.com/nodeState_drivers")
    return holds.parse_cr(
        {
            "apiVersion": "nodewright.nvidia.com/v1alpha1",
            "kind": "NodeWright",
            "metadata": {"name": "drivers"},
            "spec": {
                "nodeSelectors": {"matchLabels": {"pool": "gpu"}},
                "additionalTolerations": [{"key": "nodegate.io/hold", "operator": "Exists"}],
                "packages": {"dexter": {"version": "1.2.3"}, "tuning": {"version": "0.4.0"}},
            },
            "status": {"nodeState": {"gpu-1": json.loads(raw)}} if raw else {},
        }
    )


VALID = holds.AttestationView(False, T0, T0 + timedelta(hours=1))
REVOKED = holds.AttestationView(True, T0, T0 + timedelta(hours=1))


def _decide(
    node: dict[str, Any], att: holds.AttestationView | None, now: datetime, since: datetime | None = None
) -> holds.Decision:
    return holds.decide(
        node=node,
        attestation=att,
        crs=[_cr(node)],
        now=now,
        stability_window=timedelta(seconds=30),
        attestation_lifetime=None,
        complete_since=since,
    )


def _with_status(status: dict[str, Any]) -> dict[str, Any]:
    """A whole object: the join service's half of the status, then the gate's."""
    return {
        "apiVersion": "nodegate.io/v1alpha1",
        "kind": "NodeAttestation",
        "metadata": {"name": "gpu-1"},
        "spec": {"ekSha256": EK, "spiffeId": "spiffe://example.org/node/gpu-1", "revoked": False},
        "status": {"attestedAt": "2026-03-01T12:00:00Z", "expiresAt": "2026-03-01T13:00:00Z", **status},
    }


@pytest.mark.parametrize(
    ("stage", "state", "att", "phase", "reason"),
    [
        (None, None, VALID, "Held", "packages-pending"),  # no node state: stage and state are null
        ("apply", "in_progress", VALID, "Held", "packages-pending"),
        ("apply", "erroring", VALID, "Held", "validation-failed"),
        ("config", "complete", None, "Held", "unattested"),
        ("config", "complete", REVOKED, "Quarantined", "quarantined"),
    ],
)
def test_gate_held_status_conforms(
    na_crd: dict[str, Any],
    gate_status: GateStatus,
    stage: str | None,
    state: str | None,
    att: holds.AttestationView | None,
    phase: str,
    reason: str,
) -> None:
    now = T0 + timedelta(minutes=5)
    decision = _decide(_node(stage, state), att, now)
    assert (decision.phase, decision.reason) == (phase, reason)
    status = gate_status(decision, {}, now)
    assert status["reason"] == reason
    assert len(status["packages"]) == 2
    assert errors(na_crd, _with_status(status)) == []


def test_gate_released_status_conforms(na_crd: dict[str, Any], gate_status: GateStatus) -> None:
    node = _node("config", "complete")
    node["metadata"]["annotations"]["nodewright.nvidia.com/nodeState_drivers"] = json.dumps(
        {
            f"{p}|{v}": {"name": p, "version": v, "image": "x", "stage": "config", "state": "complete"}
            for p, v in (("dexter", "1.2.3"), ("tuning", "0.4.0"))
        }
    )
    first = T0 + timedelta(minutes=1)
    held = gate_status(_decide(node, VALID, first), {}, first)  # complete, the window just started
    assert (held["phase"], held["completeSince"]) == ("Held", "2026-03-01T12:01:00Z")
    later = first + timedelta(minutes=1)
    decision = _decide(node, VALID, later, since=first)
    assert (decision.phase, decision.reason) == ("Ready", None)
    released = gate_status(decision, held, later)  # carries the Held condition forward
    assert released["reason"] == ""
    assert [c["status"] for c in released["conditions"]] == ["False"]
    assert errors(na_crd, _with_status(held)) == []
    assert errors(na_crd, _with_status(released)) == []


def test_gate_status_keeps_other_conditions(na_crd: dict[str, Any], gate_status: GateStatus) -> None:
    other = {"type": "Audited", "status": "True", "reason": "Checked", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    now = T0 + timedelta(minutes=5)
    status = gate_status(_decide(_node(None, None), VALID, now), {"conditions": [other]}, now)
    assert [c["type"] for c in status["conditions"]] == ["Audited", "Held"]
    assert errors(na_crd, _with_status(status)) == []


def test_nodeattestation_bounds_cover_the_code(na_crd: dict[str, Any]) -> None:
    props = schema_of(na_crd)["properties"]
    spec, status = props["spec"], props["status"]
    assert "required" not in spec  # objects are written in stages
    assert "required" not in status
    assert "required" not in schema_of(na_crd)
    assert spec["properties"]["spiffeId"]["maxLength"] >= store_mod.MAX_SPIFFE_ID
    assert status["properties"]["message"]["maxLength"] >= holds.MAX_MESSAGE
    assert set(get_args(holds.Phase)) <= set(status["properties"]["phase"]["enum"])
    assert status["properties"]["reason"]["enum"] == ["", *holds.HOLD_REASONS]
    condition = status["properties"]["conditions"]["items"]["properties"]
    assert condition["message"]["maxLength"] >= holds.MAX_MESSAGE


def test_boot_id_and_reset_count_conform_and_are_read(na_crd: dict[str, Any]) -> None:
    """What the join service writes at join and renewal (status.bootID, status.resetCount) is kept
    by the schema (not pruned) and read by the gate."""
    boot = "0f8e5a7c-3c1b-4d2e-9a6f-2b7c1d0e4f5a"  # /proc/sys/kernel/random/boot_id
    obj = _with_status({"bootID": boot, "resetCount": 12})
    assert errors(na_crd, obj) == []
    view = holds.attestation_view(obj)
    assert view is not None
    assert (view.boot_id, view.reset_count) == (boot, 12)
    legacy = _with_status({"bootID": None, "resetCount": None})  # an agent that sends no boot id
    assert errors(na_crd, legacy) == []
    props = schema_of(na_crd)["properties"]["status"]["properties"]
    assert props["bootID"]["maxLength"] == holds.MAX_BOOT_ID  # the gate reads no longer an id
    assert props["resetCount"]["maximum"] == 2**32 - 1  # TPMS_CLOCK_INFO.resetCount is a UINT32


def _bad(path: str, value: Any) -> dict[str, Any]:
    obj = _with_status({"phase": "Held", "reason": "unattested", "message": "m", "packages": []})
    *parents, last = path.split(".")
    node = obj
    for p in parents:
        node = node[p]
    node[last] = value
    return obj


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("status.phase", "Released"),
        ("status.reason", "rebooting"),
        ("spec.revoked", "yes"),
        ("spec.ekSha256", "AB" * 32),
        ("spec.spiffeId", "https://example.org/node"),
        ("status.attestedAt", "yesterday"),
        ("status.expiresAt", 1767225600),
        ("status.packages", [{"cr": "nodewright.nvidia.com/drivers", "package": "dexter"}]),
        ("status.packages", [{"cr": "x", "package": "p", "version": "1", "stage": 3, "state": None}]),
        ("status.conditions", [{"type": "Held", "status": "Maybe"}]),
        ("status.message", "x" * 5000),
        ("status.completeSince", "soon"),
        ("status.waitingOn", ["would be pruned"]),
        ("status.bootID", "b" * 65),
        ("status.bootID", 42),
        ("status.resetCount", -1),
        ("status.resetCount", "3"),
        ("status.resetCount", 2**32),
    ],
)
def test_wrong_nodeattestations_rejected(na_crd: dict[str, Any], path: str, value: Any) -> None:
    assert errors(na_crd, _bad(path, value)) != []


# -- PackagePolicy ---------------------------------------------------------------------------------


def _docs_example() -> dict[str, Any]:
    """The PackagePolicy example of docs/admission.md (DESIGN.md's, with the pool filled in)."""
    text = (ROOT / "docs" / "admission.md").read_text()
    section = text.split("## PackagePolicy", 1)[1]
    match = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert match is not None
    obj = yaml.safe_load(match.group(1))
    assert isinstance(obj, dict)
    return obj


def test_documented_policy_parses_and_conforms(pp_crd: dict[str, Any]) -> None:
    obj = _docs_example()
    parsed = pol.PackagePolicy.model_validate(obj)
    assert parsed.pool == {"nodegate.io/pool": "h100"}
    assert errors(pp_crd, obj) == []
    # Every field the model knows, written out by name, is one the schema keeps (not pruned).
    dumped = parsed.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert errors(pp_crd, dumped) == []


def test_minimal_policy_conforms(pp_crd: dict[str, Any]) -> None:
    obj = {
        "apiVersion": "nodegate.io/v1alpha1",
        "kind": "PackagePolicy",
        "metadata": {"name": "all"},
        "spec": {},
    }
    assert pol.PackagePolicy.model_validate(obj).spec.node_selector.empty
    assert errors(pp_crd, obj) == []


def _props(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in path.split("."):
        node = node["properties"][part]
        if node.get("type") == "array":
            node = node["items"]
    return node


@pytest.mark.parametrize(
    ("path", "model"),
    [
        ("spec", pol.PackagePolicySpec),
        ("spec.nodeSelector", pol.LabelSelector),
        ("spec.nodeSelector.matchExpressions", pol.LabelSelectorRequirement),
        ("spec.images", pol.ImagesPolicy),
        ("spec.interrupts", pol.InterruptsPolicy),
        ("spec.maxInterruptionBudget", pol.Budget),
        ("spec.priority", pol.PriorityBounds),
    ],
)
def test_policy_schema_has_the_model_fields(
    pp_crd: dict[str, Any], path: str, model: type[BaseModel]
) -> None:
    names = {f.alias or name for name, f in model.model_fields.items()}
    assert set(_props(schema_of(pp_crd), path)["properties"]) == names


def test_policy_enums_match_the_model(pp_crd: dict[str, Any]) -> None:
    schema = schema_of(pp_crd)
    assert _props(schema, "spec.interrupts.allowed")["enum"] == list(pol.INTERRUPT_TYPES)
    operators = get_args(pol.LabelSelectorRequirement.model_fields["operator"].annotation)
    assert _props(schema, "spec.nodeSelector.matchExpressions.operator")["enum"] == list(operators)


def _policy(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodegate.io/v1alpha1",
        "kind": "PackagePolicy",
        "metadata": {"name": "p"},
        "spec": spec,
    }


WRONG_POLICIES = [
    _policy(interrupts={"allowed": ["halt"]}),
    _policy(maxInterruptionBudget={"percent": 150}),
    _policy(maxInterruptionBudget={"percent": 10, "count": 2}),
    _policy(maxInterruptionBudget={}),
    _policy(maxInterruptionBudget={"count": -1}),
    _policy(nodeSelector={"matchExpressions": [{"key": "pool", "operator": "Exists"}]}),
    _policy(nodeSelector={"matchLabels": {"pool": 7}}),
    _policy(images={"registries": "registry.example.com"}),
    _policy(priority={"min": 0}),
    _policy(allowedNamespaces=["default"]),
    {"apiVersion": "nodegate.io/v1alpha1", "kind": "PackagePolicy", "metadata": {"name": "p"}},
]


@pytest.mark.parametrize("obj", WRONG_POLICIES)
def test_wrong_policies_rejected(pp_crd: dict[str, Any], obj: dict[str, Any]) -> None:
    assert errors(pp_crd, obj) != []
    with pytest.raises(ValidationError):  # and the code refuses them too
        pol.PackagePolicy.model_validate(obj)


def test_schema_is_stricter_than_lax_parsing(pp_crd: dict[str, Any]) -> None:
    """pydantic's lax mode turns "true" and "yes" into True; the apiserver never stores such an object."""
    for obj in (_policy(allowSecretEnv="true"), _policy(images={"requireDigest": "yes"})):
        assert pol.PackagePolicy.model_validate(obj)
        assert errors(pp_crd, obj) != []
