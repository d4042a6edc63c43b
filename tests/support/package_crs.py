"""Package CRs the project writes itself, for the admission tests (issue 31).

Upstream's sample and e2e CRs are upstream's material: tests that need them read them unedited
from the public test data (``tests/support/shared_data.py``, ``tests/admission/upstream``). These
are nodegate's own, each in the shape of one kind of CR that NodeWright users write, so that the
tests set the same fields and take the same validation paths:

- ``AUTO_TAINT``: gates new nodes on its package (``runtimeRequired``, ``autoTaintNewNodes``), one
  agentless package with a plain env variable, a one-node selector;
- ``SIMPLE``: the smallest useful CR: pause/disable annotations spelled out, one shellscript
  package whose two inline steps are ``config.yaml`` and ``config_check.yaml``;
- ``SAMPLE``: a GPU pool's baseline: a tolerated GPU taint, pod labels not to interrupt, a percent
  budget, a shellscript package (four steps) that depends on a tuning package, which reboots and
  maps two of its three config keys to interrupts (a reboot, a restart of all services);
- ``UNINSTALL``: one agentless package with uninstall enabled, not yet applied, a reboot
  interrupt, a count budget;
- ``MISSING_DEPENDENCY``: no selector; one package depends on a name the CR does not have.

Image names, field names, annotation and label keys are facts about NodeWright's API and its
packages; the names, versions, values and scripts here are ours. Tests deep-copy before editing.
"""

from __future__ import annotations

from typing import Any

SHELLSCRIPT = "ghcr.io/nvidia/skyhook-packages/shellscript"
TUNING = "ghcr.io/nvidia/skyhook-packages/tuning"
AGENTLESS = "ghcr.io/nvidia/skyhook/agentless"
_API = {"apiVersion": "skyhook.nvidia.com/v1alpha1", "kind": "Skyhook"}

AUTO_TAINT: dict[str, Any] = {
    **_API,
    "metadata": {"name": "gate-new-nodes"},
    "spec": {
        "runtimeRequired": True,
        "autoTaintNewNodes": True,
        "nodeSelectors": {"matchLabels": {"kubernetes.io/hostname": "gpu-node-07"}},
        "packages": {
            "firmware-check": {
                "version": "0.9.2",
                "image": AGENTLESS,
                "env": [{"name": "CHECK_TIMEOUT", "value": "30"}],
            }
        },
    },
}

SIMPLE: dict[str, Any] = {
    **_API,
    "metadata": {
        "name": "hello-nodes",
        "annotations": {"skyhook.nvidia.com/pause": "false", "skyhook.nvidia.com/disable": "false"},
    },
    "spec": {
        "nodeSelectors": {"matchLabels": {"example.com/test-pool": "admission"}},
        "packages": {
            "greeter": {
                "version": "0.4.0",
                "image": SHELLSCRIPT,
                "configMap": {
                    "config.yaml": "#!/bin/sh\necho ready > /run/greeter\n",
                    "config_check.yaml": "#!/bin/sh\ngrep -q ready /run/greeter\n",
                },
            }
        },
    },
}

# The shellscript package sorts before the tuning one, as the tests' expected orders assume.
SAMPLE: dict[str, Any] = {
    **_API,
    "metadata": {"name": "gpu-baseline"},
    "spec": {
        "additionalTolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "nodeSelectors": {"matchLabels": {"agentpool": "gpu"}},
        "podNonInterruptLabels": {"matchLabels": {"app.kubernetes.io/component": "inference"}},
        "interruptionBudget": {"percent": 25},
        "packages": {
            "boot-marker": {
                "version": "2.0.0",
                "image": SHELLSCRIPT,
                "dependsOn": {"node-tuning": "1.3.0"},
                "configMap": {
                    "apply.sh": "#!/bin/sh\ndate -u > /var/lib/gpu-baseline\n",
                    "apply_check.sh": "#!/bin/sh\ntest -s /var/lib/gpu-baseline\n",
                    "config.sh": "#!/bin/sh\necho configured >> /var/lib/gpu-baseline\n",
                    "config_check.sh": "#!/bin/sh\ngrep -q configured /var/lib/gpu-baseline\n",
                },
            },
            "node-tuning": {
                "version": "1.3.0",
                "image": TUNING,
                "interrupt": {"type": "reboot"},
                "configInterrupts": {
                    "grub.conf": {"type": "reboot"},
                    "sysctl.conf": {"type": "restartAllServices"},
                },
                "configMap": {
                    "grub.conf": "default_hugepagesz=2M hugepages=4096",
                    "sysctl.conf": "vm.swappiness=10\nnet.core.somaxconn=4096",
                    "ulimit.conf": "nofile: 1048576",
                },
            },
        },
    },
}

UNINSTALL: dict[str, Any] = {
    **_API,
    "metadata": {"name": "retire-collector"},
    "spec": {
        "nodeSelectors": {"matchLabels": {"workload": "batch"}},
        "interruptionBudget": {"count": 1},
        "packages": {
            "collector": {
                "version": "3.0.2",
                "image": AGENTLESS,
                "configMap": {
                    "apply.sh": "#!/bin/sh\ninstall -d /opt/collector\n",
                    "uninstall.sh": "#!/bin/sh\nrm -rf /opt/collector\n",
                },
                "env": [{"name": "COLLECTOR_PORT", "value": "9400"}],
                "interrupt": {"type": "reboot"},
                "uninstall": {"enabled": True, "apply": False},
            }
        },
    },
}

# "driver" is not "drivers": the kind of slip the depends-on rule is there for.
MISSING_DEPENDENCY: dict[str, Any] = {
    **_API,
    "metadata": {"name": "broken-chain"},
    "spec": {
        "packages": {
            "drivers": {"version": "2.4.0", "image": AGENTLESS},
            "toolkit": {"version": "2.4.0", "image": AGENTLESS, "dependsOn": {"driver": "2.4.0"}},
        }
    },
}


def open_policy(name: str) -> dict[str, Any]:
    """A PackagePolicy with every limit open (pool ``{}``: every node; any registry, interrupt,
    runtimeRequired, secret env and agent image): a CR meets only upstream's own rules under it."""
    return {
        "apiVersion": "nodegate.io/v1alpha1",
        "kind": "PackagePolicy",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {},
            "images": {"registries": ["*"]},
            "interrupts": {"allowed": ["noop", "service", "restartAllServices", "reboot"]},
            "allowRuntimeRequired": True,
            "allowSecretEnv": True,
            "allowAgentImageOverride": True,
        },
    }
