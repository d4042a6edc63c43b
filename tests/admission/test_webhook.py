"""The admission webhook: decisions with RBAC and policies, and real HTTP over TLS."""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission import webhook
from admission.rbac.evaluator import RbacEvaluator
from admission.reading.policy import PackagePolicy
from admission.violations import Violation
from admission.webhook import AuthorizerUnavailable, Decider, LocalRbac, StaticPolicies
from bootstrap import cli
from bootstrap.service.webhook import app as webhookapp
from tests.admission.test_admission_rules import policy
from tests.support import certs
from tests.support.package_crs import SAMPLE
from tests.support.reviewserver import listening, review_client

NODEGATE = "system:serviceaccount:nodegate:nodegate"
GPU = {"matchLabels": {"agentpool": "gpu"}}


@functools.cache
def gpu_policies() -> list[PackagePolicy]:
    """The sample policies, validated when a test first asks (functools.cache), not at import: a
    refusal by the installed pydantic or the policy model fails those tests, not the collection."""
    return [
        policy(
            "gpu",
            nodeSelector=GPU,
            images={"registries": ["ghcr.io/nvidia"]},
            interrupts={"allowed": ["noop", "service", "restartAllServices", "reboot"]},
            maxInterruptionBudget={"percent": 50},
        ),
        policy("everything", images={"registries": ["ghcr.io/nvidia"]}),  # every node; noop only
    ]


def _role(name: str, verb: str, names: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [
            {
                "apiGroups": ["nodegate.io"],
                "resources": ["packagepolicies"],
                "verbs": [verb],
                "resourceNames": names,
            }
        ],
    }


def _binding(name: str, role: str, kind: str, subject: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject}],
    }


RBAC = [
    _role("deploy-gpu", "deploy", ["gpu"]),
    _role("reboot-gpu", "reboot", ["gpu"]),
    _role("deploy-everything", "deploy", ["everything"]),
    _binding("alice-deploys", "deploy-gpu", "User", "alice"),
    _binding("platform-deploys", "deploy-gpu", "Group", "ml-platform"),
    _binding("platform-reboots", "reboot-gpu", "Group", "ml-platform"),
    _binding("root-everywhere", "deploy-everything", "User", "root"),
]


def decider(policies: list[Any] | None = None, authorizer: Any = None) -> Decider:
    source = StaticPolicies(gpu_policies() if policies is None else policies)
    return Decider(source, authorizer or LocalRbac(RbacEvaluator.from_objects(RBAC)), NODEGATE)


def review(
    obj: Any,
    *,
    op: str = "CREATE",
    old: Any = None,
    user: str = "alice",
    groups: tuple[str, ...] = (),
    kind: tuple[str, str] = ("skyhook.nvidia.com", "Skyhook"),
    dry_run: bool = False,
) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": kind[0], "version": "v1" if kind[1] == "Node" else "v1alpha1", "kind": kind[1]},
            "resource": {"group": kind[0], "version": "v1alpha1", "resource": kind[1].lower() + "s"},
            "operation": op,
            "name": (obj or old or {}).get("metadata", {}).get("name", ""),
            "userInfo": {
                "username": user,
                "uid": "u-1",
                "groups": [*groups, "system:authenticated"],
                "extra": {},
            },
            "object": obj,
            "oldObject": old,
            "dryRun": dry_run,
        },
    }


async def decide(d: Decider, body: dict[str, Any]) -> webhook.Decision:
    return await d.decide(webhook.parse_review(json.dumps(body).encode()).request)


def no_reboot(doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    tuning = doc["spec"]["packages"]["node-tuning"]
    tuning.pop("interrupt")
    tuning["configInterrupts"] = {"sysctl.conf": {"type": "restartAllServices"}}
    return doc


# -- decisions -----------------------------------------------------------------------------------


async def test_allowed_by_policy_and_rbac() -> None:
    d = await decide(decider(), review(no_reboot(SAMPLE)))
    assert d.allowed, d.message
    assert d.audit == {"decision": "allow", "policy": "gpu"}
    assert any("not pinned by digest" in w for w in d.warnings)


async def test_requester_without_deploy_is_refused() -> None:
    d = await decide(decider(), review(no_reboot(SAMPLE), user="mallory"))
    assert not d.allowed
    assert [(v.rule, v.path) for v in d.violations] == [
        ("rbac", "PackagePolicy everything"),  # candidates in name order: every pool containing the selector
        ("rbac", "PackagePolicy gpu"),
    ]
    assert "mallory lacks verb deploy on packagepolicies/gpu in nodegate.io" in d.violations[1].message


async def test_reboot_needs_the_reboot_verb() -> None:
    d = await decide(decider(), review(SAMPLE, user="alice"))
    assert not d.allowed
    gpu = next(v for v in d.violations if v.path == "PackagePolicy gpu")
    assert "lacks verb reboot" in gpu.message
    assert "node-tuning" in gpu.message
    ok = await decide(decider(), review(SAMPLE, user="bob", groups=("ml-platform",)))
    assert ok.allowed, ok.message
    assert ok.audit["reboot"] == "node-tuning"


async def test_policy_limits_are_listed_per_policy() -> None:
    doc = copy.deepcopy(SAMPLE)
    doc["spec"]["interruptionBudget"] = {"percent": 90}
    d = await decide(decider(), review(doc, user="bob", groups=("ml-platform",)))
    assert not d.allowed
    gpu = [(v.rule, v.path, v.message[:5]) for v in d.violations if v.message.startswith("[gpu]")]
    assert gpu == [("budget-cap", "spec.interruptionBudget", "[gpu]")]


async def test_structural_violations_come_first_and_need_no_rights() -> None:
    doc = copy.deepcopy(SAMPLE)
    doc["spec"]["packages"]["node-tuning"]["version"] = "latest"
    d = await decide(decider(), review(doc, user="mallory"))
    assert [v.rule for v in d.violations] == ["semver", "depends-on"]


async def test_selector_outside_every_pool_is_refused() -> None:
    doc = no_reboot(SAMPLE)
    doc["spec"]["nodeSelectors"] = {"matchLabels": {"agentpool": "cpu"}}
    d = await decide(decider(policies=gpu_policies()[:1]), review(doc))
    assert [v.rule for v in d.violations] == ["pool"]


async def test_update_that_changes_nothing_acted_on_is_allowed_for_anyone() -> None:
    old = no_reboot(SAMPLE)
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = ["skyhook.nvidia.com/skyhook"]
    d = await decide(
        decider(), review(new, op="UPDATE", old=old, user="system:serviceaccount:skyhook:operator")
    )
    assert d.allowed
    assert d.audit["reason"] == "spec unchanged"


async def test_widening_someone_elses_cr_needs_rights_for_the_wider_one() -> None:
    """alice may deploy to the gpu pool; widening the CR to every node needs deploy on 'everything'."""
    old = no_reboot(SAMPLE)
    wide = copy.deepcopy(old)
    wide["spec"]["nodeSelectors"] = {}
    for pkg in wide["spec"]["packages"].values():  # keep within 'everything's limits (noop only)
        pkg.pop("configInterrupts", None)
        pkg.pop("interrupt", None)
    wide["spec"].pop("interruptionBudget")
    d = await decide(decider(), review(wide, op="UPDATE", old=old, user="alice"))
    assert not d.allowed
    assert "lacks verb deploy on packagepolicies/everything" in d.violations[0].message
    assert (await decide(decider(), review(wide, op="UPDATE", old=old, user="root"))).allowed


async def test_pausing_is_a_change_that_needs_rights() -> None:
    old = no_reboot(SAMPLE)
    paused = copy.deepcopy(old)
    paused["metadata"]["annotations"] = {"skyhook.nvidia.com/pause": "true"}
    assert not (await decide(decider(), review(paused, op="UPDATE", old=old, user="mallory"))).allowed
    assert (await decide(decider(), review(paused, op="UPDATE", old=old, user="alice"))).allowed


@pytest.mark.parametrize("group", ["skyhook.nvidia.com", "nodewright.nvidia.com"])
async def test_both_api_groups(group: str) -> None:
    doc = {
        **no_reboot(SAMPLE),
        "apiVersion": f"{group}/v1alpha1",
        "kind": {"skyhook.nvidia.com": "Skyhook"}.get(group, "NodeWright"),
    }
    d = await decide(decider(), review(doc, kind=(group, doc["kind"])))
    assert d.allowed, d.message


async def test_fails_closed_without_policies_or_authorizer() -> None:
    class NotReady:
        def policies(self) -> None:
            return None

    local = LocalRbac(RbacEvaluator.from_objects(RBAC))
    d = await decide(Decider(NotReady(), local, NODEGATE), review(no_reboot(SAMPLE)))
    assert not d.allowed
    assert "not loaded" in d.message

    class Down:
        async def allowed(self, user: Any, attrs: Any) -> bool:
            raise AuthorizerUnavailable("SubjectAccessReview timed out")

    d = await decide(decider(authorizer=Down()), review(no_reboot(SAMPLE)))
    assert not d.allowed
    assert "authorization is unavailable (SubjectAccessReview timed out)" in d.message


async def test_nodes_and_deployment_policies_and_other_kinds() -> None:
    bare = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}, "spec": {}}
    d = await decide(decider(), review(bare, kind=("", "Node"), user="system:node:gpu-1"))
    assert [v.rule for v in d.violations] == ["node-hold-taint"]
    held = {
        **bare,
        "spec": {"taints": [{"key": "nodegate.io/hold", "value": "unattested", "effect": "NoSchedule"}]},
    }
    assert (await decide(decider(), review(held, kind=("", "Node")))).allowed
    assert not (
        await decide(decider(), review(bare, op="UPDATE", old=held, kind=("", "Node"), user="admin"))
    ).allowed
    assert (
        await decide(decider(), review(bare, op="UPDATE", old=held, kind=("", "Node"), user=NODEGATE))
    ).allowed
    dp = {"apiVersion": "skyhook.nvidia.com/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": "p"},
          "spec": {"default": {"budget": {"percent": 100}, "strategy": {"fixed": {}}}}}  # fmt: skip
    d = await decide(decider(), review(dp, kind=("skyhook.nvidia.com", "DeploymentPolicy")))
    assert [v.rule for v in d.violations] == ["budget-cap"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}
    assert not (await decide(decider(), review(pod, kind=("", "Pod")))).allowed


async def test_response_shape() -> None:
    body = review(no_reboot(SAMPLE), user="mallory", dry_run=True)
    d = await decide(decider(), body)
    resp = d.response(body["request"]["uid"])
    assert resp["uid"] == body["request"]["uid"]
    assert resp["allowed"] is False
    assert resp["status"]["code"] == 403
    assert resp["status"]["reason"] == "Forbidden"
    assert resp["status"]["message"].splitlines()[1].startswith("- PackagePolicy everything:")
    assert "patch" not in resp


# -- real HTTP over TLS --------------------------------------------------------------------------


def _tls(tmp: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    cert_file, key_file, _ = certs.loopback_tls(tmp, "nodegate.nodegate.svc")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.minimum_version = ssl.TLSVersion.TLSv1_2
    server.load_cert_chain(cert_file, key_file)
    client = ssl.create_default_context(cafile=str(cert_file))
    return server, client


@pytest.fixture
async def endpoint(tmp_path: Path) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    server_ctx, client_ctx = _tls(tmp_path)
    async with (
        listening(webhookapp.make_app(decider()), server_ctx) as site,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx)) as session,
    ):
        yield f"https://127.0.0.1:{site.port}/admission/validate", session


async def test_review_over_tls(endpoint: tuple[str, aiohttp.ClientSession]) -> None:
    url, session = endpoint
    body = review(no_reboot(SAMPLE))
    async with session.post(url, json=body) as resp:
        assert resp.status == 200
        out = await resp.json()
    assert out["apiVersion"] == "admission.k8s.io/v1"
    assert out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == body["request"]["uid"]
    assert out["response"]["allowed"] is True


@pytest.mark.parametrize(
    ("payload", "content_type", "status"),
    [
        (b"{not json", "application/json", 400),
        (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}).encode(),
         "application/json", 400),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
         "application/json", 400),
        (b"[" * 100_000, "application/json", 400),
        (b"{}", "text/plain", 415),
        (b'{"a": "' + b"x" * (5 * 1024 * 1024) + b'"}', "application/json", 413),
    ],
)  # fmt: skip
async def test_bad_bodies_get_clear_errors(
    endpoint: tuple[str, aiohttp.ClientSession], payload: bytes, content_type: str, status: int
) -> None:
    url, session = endpoint
    async with session.post(url, data=payload, headers={"Content-Type": content_type}) as resp:
        assert resp.status == status
        assert resp.content_type == "application/problem+json"
        problem = await resp.json()
    assert problem["status"] == status
    assert problem["code"] in ("malformed_request", "payload_too_large")
    assert problem["detail"]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    request=st.dictionaries(
        st.sampled_from(["uid", "kind", "operation", "userInfo", "object", "oldObject"]), _json
    )
)
def test_arbitrary_reviews_never_fail_the_server(request: dict[str, Any]) -> None:
    """Any JSON in the request stanza gives 200 or 400, never an exception (500)."""
    body = json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()
    try:
        parsed = webhook.parse_review(body)
    except webhook.ReviewError:
        return
    decision = asyncio.run(decider().decide(parsed.request))
    assert isinstance(decision.allowed, bool)


# -- nodegate policy test ------------------------------------------------------------------------


def test_policy_test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "policies.yaml").write_text(
        yaml.safe_dump_all([p.model_dump(by_alias=True, exclude_none=True) for p in gpu_policies()])
    )
    (tmp_path / "rbac.yaml").write_text(yaml.safe_dump_all(RBAC))
    good, bad = review(no_reboot(SAMPLE)), review(no_reboot(SAMPLE), user="mallory")
    (tmp_path / "good.json").write_text(json.dumps(good))
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    args = [
        "policy",
        "test",
        "--policy",
        str(tmp_path / "policies.yaml"),
        "--rbac",
        str(tmp_path / "rbac.yaml"),
    ]
    assert cli.main([*args, "-o", "json", str(tmp_path / "good.json"), str(tmp_path / "bad.yaml")]) == 1
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["response"]["uid"], r["response"]["allowed"]) for r in lines] == [
        (good["request"]["uid"], True),
        (bad["request"]["uid"], False),
    ]
    assert cli.main([*args, str(tmp_path / "good.json")]) == 0
    capsys.readouterr()
    assert cli.main([*args, str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_policy_audit_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "policies.yaml").write_text(
        yaml.safe_dump_all([p.model_dump(by_alias=True, exclude_none=True) for p in gpu_policies()])
    )
    over = copy.deepcopy(SAMPLE)
    over["metadata"]["name"] = "over-budget"
    over["spec"]["interruptionBudget"] = {"percent": 90}
    broken = copy.deepcopy(SAMPLE)
    broken["metadata"]["name"] = "broken"
    broken["spec"]["packages"]["node-tuning"]["version"] = "2024/01"  # NodeWright refuses it
    everywhere = copy.deepcopy(SAMPLE)
    everywhere["metadata"]["name"] = "tolerates-all"
    everywhere["spec"]["additionalTolerations"] = [{"operator": "Exists"}]  # nodegate's own rule
    listing = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [SAMPLE, over, broken, everywhere, {"kind": "ConfigMap"}],
    }
    (tmp_path / "crs.yaml").write_text(yaml.safe_dump(listing))
    assert (
        cli.main(["policy", "audit", "--policy", str(tmp_path / "policies.yaml"), str(tmp_path / "crs.yaml")])
        == 1
    )
    out = capsys.readouterr()
    refused = {json.loads(line)["name"]: json.loads(line)["violations"] for line in out.out.splitlines()}
    assert set(refused) == {"over-budget", "broken", "tolerates-all"}
    assert any("budget" in v for v in refused["over-budget"])
    assert any("semantic version" in v for v in refused["broken"])
    assert any("tolerates every taint" in v for v in refused["tolerates-all"])
    assert "identity-dependent rules are not audited" in out.err


async def test_readyz_follows_the_policy_source() -> None:
    class Flag:
        items: list[Any] | None = None

        def policies(self) -> list[Any] | None:
            return self.items

    flag = Flag()
    app = webhookapp.make_app(Decider(flag, LocalRbac(RbacEvaluator.from_objects(RBAC)), NODEGATE))
    async with review_client(app) as client:
        assert (await client.get("/readyz")).status == 503
        flag.items = gpu_policies()
        assert (await client.get("/readyz")).status == 200


# -- compiled policies, reading, encoding --------------------------------------------------------


async def test_policies_are_compiled_again_when_the_source_changes_them() -> None:
    class Source:
        def __init__(self) -> None:
            self.items = list(gpu_policies())

        def policies(self) -> list[Any]:
            return list(self.items)  # a new list each time, as the cluster watcher hands them out

    source = Source()
    d = Decider(source, LocalRbac(RbacEvaluator.from_objects(RBAC)), NODEGATE)
    body = review(no_reboot(SAMPLE))
    assert (await decide(d, body)).allowed
    first = d.compiled_policies()
    assert first is d.compiled_policies()  # same objects: compiled once
    source.items = [
        policy("gpu", nodeSelector=GPU, images={"registries": ["registry.example.com"]}),
        gpu_policies()[1],
    ]
    denied = await decide(d, body)
    assert not denied.allowed
    assert ("registry", "spec.packages.node-tuning.image") in [(v.rule, v.path) for v in denied.violations]
    source.items = source.items[1:]  # the gpu policy is gone
    assert [c.name for c in d.compiled_policies() or ()] == ["everything"]


async def test_an_invalid_registry_allowlist_denies_and_says_why() -> None:
    allowed = {"allowed": ["noop", "restartAllServices"]}
    broken = policy("gpu", nodeSelector=GPU, images={"registries": ["not-a-registry"]}, interrupts=allowed)
    d = await decide(decider(policies=[broken]), review(no_reboot(SAMPLE)))
    assert not d.allowed
    assert [(v.rule, v.path) for v in d.violations] == [("registry", "PackagePolicy gpu")]
    assert "allowlist is invalid" in d.violations[0].message


async def test_the_same_spec_spelled_otherwise_is_unchanged() -> None:
    old = no_reboot(SAMPLE)
    new = copy.deepcopy(old)
    new["spec"]["priority"] = 200  # the default, spelled out
    new["spec"]["packages"] = dict(reversed(new["spec"]["packages"].items()))
    new["spec"]["packages"]["node-tuning"]["env"] = []
    d = await decide(decider(), review(new, op="UPDATE", old=old, user="mallory"))
    assert d.allowed
    assert d.audit["reason"] == "spec unchanged"
    new["spec"]["packages"]["node-tuning"]["configMap"]["grub.conf"] = "other"
    assert not (await decide(decider(), review(new, op="UPDATE", old=old, user="mallory"))).allowed


async def test_a_cr_the_fast_reader_leaves_to_pydantic_is_judged_the_same() -> None:
    doc = no_reboot(SAMPLE)
    doc["spec"]["interruptionBudget"] = {"percent": "25"}  # a string the model coerces to 25
    d = await decide(decider(), review(doc))
    assert d.allowed, d.message
    doc["spec"]["interruptionBudget"] = {"percent": "lots"}
    d = await decide(decider(), review(doc))
    assert [(v.rule, v.path) for v in d.violations] == [("schema", "spec.interruptionBudget.percent")]


_texts = st.text(max_size=30)


@settings(max_examples=300, deadline=None)
@given(
    allowed=st.booleans(),
    message=_texts,
    violations=st.lists(st.builds(Violation, _texts, _texts, _texts, _texts), max_size=25),
    warnings=st.lists(_texts, max_size=12),
    audit=st.dictionaries(_texts, _texts, max_size=3),
    uid=st.text(min_size=1, max_size=40),
)
def test_responses_are_encoded_as_json_dumps_writes_them(
    allowed: bool, message: str, violations: list[Any], warnings: list[str], audit: dict[str, str], uid: str
) -> None:
    decision = webhook.Decision(allowed, message, violations, warnings, audit)
    expected = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": decision.response(uid),
    }
    assert webhook.encode_review_response(decision, uid) == json.dumps(expected).encode()


_REQUEST_FIELDS = ("uid", "operation", "name", "namespace", "sub_resource", "object", "old_object", "dry_run")


def _request_fields(req: Any) -> tuple[Any, ...]:
    kind, user = req.kind, req.user_info
    return (
        *(getattr(req, f) for f in _REQUEST_FIELDS),
        (kind.group, kind.version, kind.kind),
        (user.username, user.uid, user.groups, user.extra),
    )


_scalars = (
    st.none() | st.booleans() | st.integers(-2, 300) | st.sampled_from(["", "u", "x" * 257, "CREATE", "Pod"])
)
_values = st.recursive(
    _scalars, lambda c: st.lists(c, max_size=2) | st.dictionaries(st.text(max_size=4), c, max_size=2)
)
_envelope_keys = [
    *("uid", "kind", "operation", "userInfo", "object", "oldObject", "dryRun", "name", "namespace"),
    *("subResource", "sub_resource", "user_info", "dry_run", "old_object", "group", "version", "username"),
    *("groups", "extra", "apiVersion", "api_version", "request", "other"),
]


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_reviews_read_without_the_models_hold_what_the_models_do(data: st.DataObject) -> None:
    body = review(no_reboot(SAMPLE), op=data.draw(st.sampled_from(["CREATE", "UPDATE", "DELETE"])))
    body["request"]["userInfo"]["extra"] = data.draw(st.sampled_from([{}, {"k": ["v"]}]))
    places = [body, body["request"], body["request"]["kind"], body["request"]["userInfo"]]
    for _ in range(data.draw(st.integers(0, 2))):  # values of any type, anywhere in the envelope
        place = data.draw(st.sampled_from(places))
        place[data.draw(st.sampled_from(_envelope_keys))] = data.draw(_values)
    raw = json.dumps(body).encode() if data.draw(st.booleans()) else data.draw(st.binary(max_size=20))
    try:
        expected: Any = webhook.parse_review(raw).request
    except webhook.ReviewError as exc:
        expected = str(exc)
    try:
        got: Any = webhook.read_review(raw)
    except webhook.ReviewError as exc:
        got = str(exc)
    if isinstance(expected, str):
        assert got == expected  # the same refusal, in the same words
    else:
        assert _request_fields(got) == _request_fields(expected)
