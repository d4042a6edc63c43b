"""Why a package failed: the failing container of its package pod, read from the pods on the node.
Pure: the controller lists the node's pods (read-only) and passes them in.

NodeWright decides ``erroring`` from the package pod's init containers (research: an init
container terminated non-zero, or waiting in CrashLoopBackOff), and its status says only the stage.
The pod says more: which container, its termination reason and its message (what the container
wrote to its termination log). Both are shown cut to a line, single-spaced, with anything that
looks like a credential (``password=...``, ``token: ...``, a bearer token) replaced, since a
package's script may echo its environment into them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bootstrap.gate.holds import MAX_MESSAGE, MAX_WAITING, Decision
from bootstrap.gate.nodewright import MAX_LINE, PREFIXES

MAX_TEXT = 160  # of a termination message, after cleaning
# key=value or key: value where the key names a secret; a bearer token; long base64/hex runs
_SECRET = re.compile(
    r"(?i)\b([\w.-]*(?:password|passwd|secret|token|api[_-]?key|credential|private[_-]?key)[\w.-]*)"
    r"(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|\S+)"
)
_BEARER = re.compile(r"(?i)\b(bearer)\s+\S+")
_BLOB = re.compile(r"[A-Za-z0-9+/_=-]{40,}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


@dataclass(frozen=True, slots=True)
class PackageFailure:
    """One failing package of one CR on one node, as its pod shows it (``pod`` None: gone)."""

    cr: str  # "<group>/<name>"
    package: str
    version: str
    pod: str | None = None  # "<namespace>/<name>"
    container: str | None = None
    reason: str | None = None
    exit_code: int | None = None
    message: str | None = None
    unread: str | None = None  # why the pods could not be read

    def text(self) -> str:
        head = f"{self.cr}: {self.package} {self.version} failed"
        if self.unread is not None:
            return f"{head}: its package pods could not be read ({self.unread})"
        if self.pod is None:
            return f"{head}: its package pod is gone (NodeWright deleted it, or it was never created)"
        code = f", exit {self.exit_code}" if self.exit_code is not None else ""
        said = f": {self.message.replace(';', ',')}" if self.message else ""  # ';' separates lines
        return f"{head}: pod {self.pod} container {self.container} {self.reason or 'failed'}{code}{said}"


def clean(text: str, limit: int = MAX_TEXT) -> str:
    """One line, no credentials, at most ``limit`` characters."""
    out = _CONTROL.sub(" ", text)
    out = _SECRET.sub(lambda m: f"{m.group(1)}{m.group(2)}<redacted>", out)
    out = _BEARER.sub(r"\1 <redacted>", out)
    out = _BLOB.sub("<redacted>", out)
    out = " ".join(out.split())
    return out if len(out) <= limit else out[: limit - 3] + "..."


def _obj(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = parent.get(key)
    return value if isinstance(value, Mapping) else {}


def _is_package_pod(pod: Mapping[str, Any], cr: str, package: str, version: str) -> bool:
    labels = _obj(_obj(pod, "metadata"), "labels")
    return any(
        labels.get(f"{p}/name") == cr and labels.get(f"{p}/package") == f"{package}-{version}"
        for p in PREFIXES
    )


def _failing(statuses: object) -> tuple[str, Mapping[str, Any]] | None:
    """The first container that failed: terminated non-zero now, or waiting (CrashLoopBackOff)
    after a non-zero termination."""
    for status in statuses if isinstance(statuses, list) else ():
        if not isinstance(status, Mapping):
            continue
        name = str(status.get("name", "?"))
        state, last = _obj(status, "state"), _obj(status, "lastState")
        terminated = _obj(state, "terminated")
        if terminated and terminated.get("exitCode") not in (0, None):
            return name, terminated
        waiting = _obj(state, "waiting")
        previous = _obj(last, "terminated")
        if waiting and previous and previous.get("exitCode") not in (0, None):
            return name, {
                **previous,
                "reason": f"{waiting.get('reason', 'Waiting')} after {previous.get('reason', 'Error')}",
            }
    return None


def failure(pods: Sequence[Mapping[str, Any]], cr_ref: str, package: str, version: str) -> PackageFailure:
    """Why the package failed, from the newest package pod of it on the node."""
    cr = cr_ref.split("/", 1)[-1]
    mine = [p for p in pods if _is_package_pod(p, cr, package, version)]
    mine.sort(key=lambda p: str(_obj(p, "metadata").get("creationTimestamp", "")), reverse=True)
    base = PackageFailure(cr_ref, package, version)
    for pod in mine:
        meta, status = _obj(pod, "metadata"), _obj(pod, "status")
        found = _failing(status.get("initContainerStatuses")) or _failing(status.get("containerStatuses"))
        if found is None:
            continue
        container, term = found
        code = term.get("exitCode")
        return replace(
            base,
            pod=clean(f"{meta.get('namespace', '')}/{meta.get('name', '')}", 120),
            container=clean(container, 64),
            reason=clean(str(term.get("reason") or "Error"), 64),
            exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
            message=clean(str(term.get("message") or "")) or None,
        )
    if mine:  # a pod, but no container says why (yet): name the pod
        first = _obj(mine[0], "metadata")
        shown = clean(f"{first.get('namespace', '')}/{first.get('name', '')}", 120)
        phase = clean(str(_obj(mine[0], "status").get("phase", "?")), 32)
        return replace(base, pod=shown, container="-", reason=f"not failed yet (phase {phase})")
    return base


def erroring(decision: Decision) -> tuple[tuple[str, str, str], ...]:
    """The (CR, package, version) the decision found erroring: those whose pods say why."""
    return tuple((p.cr, p.package, p.version) for p in decision.packages if p.state == "erroring")


def with_failures(decision: Decision, failures: Sequence[PackageFailure]) -> Decision:
    """The decision with a line per failing package, after the attestation's problem and before
    the rest (what to look at first)."""
    if not failures or decision.reason is None:
        return decision
    lines = [f.text()[:MAX_LINE] for f in failures]
    head = 1 if decision.problem is not None else 0
    waiting = [*decision.waiting_on[:head], *lines, *decision.waiting_on[head:]]
    shown = waiting[:MAX_WAITING]
    message = f"{decision.reason}: " + "; ".join(shown)
    return replace(decision, waiting_on=tuple(shown), message=message[:MAX_MESSAGE])


# What PackageFailure.text wrote, read back from a gate message (for `kubectl nodegate status`).
_FAILED = re.compile(r"([a-z0-9.-]+/[^ ;:]+: [^ ;]+ [^ ;]+ failed: [^;]*)")


def failure_causes(message: str) -> list[str]:
    return _FAILED.findall(message)
