"""Upstream's sample CRs and the CRs in its documentation, as a user would ``kubectl apply -f``
them (each file or block to a cluster of its own). No upstream test asserts a verdict on these,
so it is derived from upstream's rules; the CRD refuses a few before any webhook runs (a
DeploymentPolicy without ``default`` or ``default.strategy``, ``operator/README.md``'s
``restart_all_services``). The same documents are in both repositories.
"""

from __future__ import annotations

from typing import Any

from tests.admission.upstream.model import E2E_LABELS, SHELLSCRIPT, TEST_NODE, WORKERS, Case
from tests.admission.upstream.objects import (
    REBOOT,
    budget,
    compartment,
    exponential,
    fixed,
    linear,
    pkg,
    service,
)
from tests.admission.upstream.scenario import Scenario, policy, skyhook

DERIVED = "derived from upstream's rules (no upstream test asserts this object)"

_TUNING = {
    "grub.conf": "hugepagesz=1G\nhugepages=2\nhugepagesz=2M\nhugepages=5128",
    "sysctl.conf": (
        "fs.inotify.max_user_instances=65535\nfs.inotify.max_user_watches=524288\nkernel.threads-max=16512444\n"
        "vm.max_map_count=262144\nvm.min_free_kbytes=65536"
    ),
    "ulimit.conf": "memlock: 128\nfsize: 1000",
}


def _important(shebang: str) -> dict[str, str]:
    return {
        "apply.sh": f'{shebang}echo "hello world" > /skyhook-hello-world\nsleep 60',
        "apply_check.sh": f"{shebang}cat /skyhook-hello-world\nsleep 30",
        "config.sh": f'{shebang}echo "a config is run" >> /skyhook-hello-world\nsleep 60',
        "config_check.sh": f'{shebang}grep "config" /skyhook-hello-world\nsleep 30',
    }


def _tuning(sysctl_interrupt: str) -> dict[str, Any]:
    return pkg(
        "1.0.0",
        "ghcr.io/nvidia/skyhook-packages/tuning",
        interrupt=REBOOT,
        configInterrupts={"grub.conf": REBOOT, "sysctl.conf": {"type": sysctl_interrupt}},
        configMap=_TUNING,
    )


def _gpu_example(
    name: str, important: str, shebang: str, sysctl_interrupt: str, **meta: Any
) -> dict[str, Any]:
    spec = {
        "additionalTolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "nodeSelectors": {"matchLabels": {"agentpool": "gpu"}},
        "podNonInterruptLabels": {"matchLabels": {"key": "value"}},
        "interruptionBudget": budget(percent=33),
        "packages": {
            important: pkg(
                "1.0.0", SHELLSCRIPT, dependsOn={"tuning": "1.0.0"}, configMap=_important(shebang)
            ),
            "tuning": _tuning(sysctl_interrupt),
        },
    }
    return skyhook(name, spec, **meta)


def samples() -> list[tuple[str, str, dict[str, Any]]]:
    """(path, item, object): operator/config/samples and examples."""
    sample_labels = {
        "app.kubernetes.io/name": "skyhook",
        "app.kubernetes.io/instance": "skyhook-sample",
        "app.kubernetes.io/part-of": "skyhook-operator",
        "app.kubernetes.io/managed-by": "kustomize",
        "app.kubernetes.io/created-by": "skyhook-operator",
    }
    grouping = {
        "additionalTolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "nodeSelectors": {"matchLabels": {"agentpool": "blockwood"}},
        "interruptionBudget": budget(percent=25),
        "packages": {
            "spenser": None,  # an empty entry in the sample; the API server drops it
            "zeb": pkg("2.1.4", "ghcr.io/nvidia/skyhook/agentless:latest", interrupt=service("cron")),
            "dax": pkg(
                "1.2.3", "ghcr.io/nvidia/skyhook/agentless:latest", interrupt=service("containerd", "foobar")
            ),
        },
    }
    policy_sample = {
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
    }
    gates = {"skyhook.nvidia.com/pause": "false", "skyhook.nvidia.com/disable": "false"}
    wait_for_pod = {
        "nodeSelectors": {"matchLabels": {"eks.amazonaws.com/nodegroup": "demo"}},
        "interruptionBudget": budget(percent=100),
        "podNonInterruptLabels": {"matchLabels": {"app": "skyhook-demo-workload"}},
        "packages": {
            "baz": pkg(
                "1.1.0",
                SHELLSCRIPT,
                interrupt=REBOOT,
                configMap={
                    "config.yaml": "#!/bin/bash\nsleep 100",
                    "config_check.yaml": "#!/bin/bash\nsleep 100",
                },
            )
        },
    }
    simple = {
        "nodeSelectors": TEST_NODE,
        "packages": {
            "baz": pkg(
                "1.1.0",
                SHELLSCRIPT,
                configMap={
                    "config.yaml": '#!/bin/bash\nsleep 1\necho "Hello, config!"',
                    "config_check.yaml": '#!/bin/bash\nsleep 1\necho "Hello, config check!"',
                },
            )
        },
    }
    return [
        (
            "operator/config/samples/deploymentpolicy_v1alpha1_deploymentpolicy.yaml",
            "document 0 DeploymentPolicy/sample-policy",
            policy("sample-policy", policy_sample),
        ),
        (
            "examples/interrupt-wait-for-pod/scr.yaml",
            "document 0 Skyhook/demo",
            skyhook("demo", wait_for_pod, labels=E2E_LABELS, annotations=gates),
        ),
        (
            "examples/simple/scr.yaml",
            "document 0 Skyhook/demo",
            skyhook("demo", simple, labels=E2E_LABELS, annotations=gates),
        ),
        (
            "operator/config/samples/interrupt_group.yaml",
            "document 0 Skyhook/grouping",
            skyhook("grouping", grouping),
        ),
        (
            "operator/config/samples/skyhook_v1alpha1_skyhook.yaml",
            "document 0 Skyhook/skyhook-sample",
            _gpu_example(
                "skyhook-sample",
                "something-important",
                "#!/bin/bash\n",
                "restartAllServices",
                labels=sample_labels,
            ),
        ),
    ]


def docs() -> list[tuple[str, str, dict[str, Any]]]:
    """(path, item, object): CRs shown in the documentation."""
    readme = {
        "nodeSelectors": WORKERS,
        "packages": {
            "something-important": pkg(
                "1.1.1",
                SHELLSCRIPT,
                configMap={
                    "apply.sh": '#!/bin/bash\necho "hello world" > /skyhook-hello-world\nsleep 10',
                    "apply_check.sh": (
                        "#!/bin/bash\n           cat /skyhook-hello-world | wc -l | grep -q 1\n sleep 10"
                    ),
                },
            )
        },
    }
    kyverno = {
        "packages": {
            "shellscript": pkg("1.3.2", SHELLSCRIPT, configMap={"config.sh": '#!/bin/bash\necho "hello"'})
        }
    }
    gpu_switch = {"packages": {"gpu-driver": pkg("1.0.0", "example/gpu-driver", interrupt=REBOOT)}}
    grow = exponential(initialBatch=1, growthFactor=2, batchThreshold=100, failureThreshold=1, safetyLimit=50)
    default_fixed = fixed(initialBatch=1, batchThreshold=100, safetyLimit=50)
    my_policy = {
        "resetBatchStateOnCompletion": True,
        "default": {"budget": budget(percent=100), "strategy": default_fixed},
        "compartments": [compartment("production", {"env": "production"}, budget(percent=25), grow)],
    }
    dp_doc = "docs/deployment_policy.md"
    return [
        (
            "README.md",
            "yaml block 2 (heredoc) document 0 Skyhook/skyhook-sample",
            skyhook("skyhook-sample", readme),
        ),
        (
            "docs/kyverno/kyverno/README.md",
            "yaml block 3 (block) document 0 Skyhook/test-scr",
            skyhook("test-scr", kyverno, labels=E2E_LABELS),
        ),
        (
            "docs/interrupt_flow.md",
            "yaml block 0 (block) document 0 Skyhook/gpu-mode-switch",
            skyhook("gpu-mode-switch", gpu_switch),
        ),
        (
            dp_doc,
            "yaml block 0 (block) document 0 DeploymentPolicy/my-policy",
            policy("my-policy", my_policy),
        ),
        # A snippet with the budget only: the CRD requires default.strategy.
        (
            dp_doc,
            "yaml block 6 (block) document 0 DeploymentPolicy/my-policy",
            policy(
                "my-policy", {"resetBatchStateOnCompletion": True, "default": {"budget": budget(percent=25)}}
            ),
        ),
        (
            dp_doc,
            "yaml block 7 (block) document 0 Skyhook/my-skyhook",
            skyhook(
                "my-skyhook",
                {
                    "deploymentPolicy": "my-policy",
                    "deploymentPolicyOptions": {"resetBatchStateOnCompletion": False},
                },
            ),
        ),
        # Options only: the CRD requires a default.
        (
            dp_doc,
            "yaml block 8 (block) document 0 DeploymentPolicy/preserve-state-policy",
            policy("preserve-state-policy", {"resetBatchStateOnCompletion": False}),
        ),
        (
            dp_doc,
            "yaml block 10 (block) document 0 Skyhook/my-skyhook",
            skyhook(
                "my-skyhook",
                {
                    "deploymentPolicy": "my-policy",
                    "deploymentPolicyOptions": {"resetBatchStateOnCompletion": True},
                    "nodeSelectors": {"matchLabels": {"workload": "gpu"}},
                    "packages": None,  # "# ..." in the document
                },
            ),
        ),
        (
            dp_doc,
            "yaml block 12 (block) document 0 DeploymentPolicy/legacy-equivalent",
            policy(
                "legacy-equivalent", {"default": {"budget": budget(percent=25), "strategy": default_fixed}}
            ),
        ),
        # An interrupt type and a package name the CRD and the webhook refuse.
        (
            "operator/README.md",
            "yaml block 0 (block) document 0 Skyhook/skyhook-example",
            _gpu_example("skyhook-example", "something_important", "#!/bin/bash\n", "restart_all_services"),
        ),
    ]


def cases(repo: str) -> list[Case]:
    out: list[Case] = []
    for source, documents in (("samples", samples()), ("docs", docs())):
        for path, item, body in documents:
            s = Scenario(repo, source, "", DERIVED)
            s.apply(path, item, body, kubectl=True)
            out += s.cases
    return out
