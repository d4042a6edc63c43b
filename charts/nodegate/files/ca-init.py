"""nodegate chart, init container: make sure the shared CA Secret holds a CA and a session key, then
wait until the kubelet shows them in the pod and check that the service will accept them.

Every replica must use the same signing authorities (an SVID issued by one replica is verified by
the others, and they publish one trust bundle) and the same session key (a join started on one
replica finishes on another). Both live in one Secret, mounted read-only at state_dir/ca (and
state_dir/session.key). With NODEGATE_CA_GENERATE=true the first pod that finds the Secret without
them writes them; the write carries the resourceVersion it read, so of replicas starting together
exactly one wins and the others use its CA. Existing keys are never replaced. Key material is never
printed.

Environment: NODEGATE_CA_SECRET (name), NODEGATE_CA_DIR (where the Secret is mounted),
NODEGATE_TRUST_DOMAIN, NODEGATE_CA_GENERATE (true/false), NODEGATE_CA_WAIT_SECONDS, POD_NAMESPACE,
KUBERNETES_SERVICE_HOST/PORT (set by the kubelet), NODEGATE_SERVICEACCOUNT_DIR (token and ca.crt;
default: the mounted service account).
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import secrets
import ssl
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# From the nodegate image (its python3 is the venv the package is installed in).
from attest import ca
from bootstrap.service.join import sessions
from bootstrap.service.pki.authority import CaStore, CaUnavailable

INDEX = "index.json"
SESSION_KEY = "session.key"
ATTEMPTS = 8
MAX_RESPONSE = 4 * 1024 * 1024
PREFIX = "nodegate ca-init:"
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


class InitError(Exception):
    """A condition the operator has to fix; the message says what."""


class Api:
    """The few Kubernetes API calls this needs, with the pod's service account token."""

    def __init__(self, sa_dir: Path) -> None:
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise InitError("KUBERNETES_SERVICE_HOST is not set: not running in a cluster")
        try:
            if ipaddress.ip_address(host).version == 6:
                host = f"[{host}]"
        except ValueError:
            pass  # a host name
        self.base = f"https://{host}:{port}"
        self._sa_dir = sa_dir
        try:
            self._ctx = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
        except (OSError, ssl.SSLError) as exc:
            raise InitError(f"cannot load the cluster CA from {sa_dir / 'ca.crt'}: {exc}") from None

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body); status 0 when the API could not be reached."""
        try:
            token = (self._sa_dir / "token").read_text().strip()  # projected tokens rotate: read each time
        except OSError as exc:
            raise InitError(f"cannot read the service account token: {exc.strerror}") from None
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/merge-patch+json"
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)  # noqa: S310 (https only)
        try:
            with urllib.request.urlopen(request, context=self._ctx, timeout=10) as resp:  # noqa: S310
                raw = resp.read(MAX_RESPONSE + 1)
                status = int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code, {}
        except (urllib.error.URLError, OSError) as exc:
            print(f"{PREFIX} API not reachable yet: {exc}", file=sys.stderr)
            return 0, {}
        if len(raw) > MAX_RESPONSE:
            raise InitError(f"{method} {path}: the response is larger than {MAX_RESPONSE} bytes")
        try:
            doc = json.loads(raw)
        except ValueError:
            raise InitError(f"{method} {path}: the API answered something that is not JSON") from None
        return status, doc if isinstance(doc, dict) else {}


def missing_parts(data: dict[str, Any], trust_domain: str) -> dict[str, bytes]:
    """The files to add to the Secret: a new CA when it has no index, a session key when it has none."""
    add: dict[str, bytes] = {}
    if INDEX not in data:
        add.update(ca.initial(trust_domain, now=datetime.now(UTC)).dump())
    if SESSION_KEY not in data:
        add[SESSION_KEY] = (secrets.token_hex(32) + "\n").encode()
    return add


def ensure_secret(api: Api, namespace: str, name: str, trust_domain: str) -> str:
    path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
    where = f"Secret {namespace}/{name}"
    for attempt in range(ATTEMPTS):
        status, secret = api.call("GET", path)
        if status == 404:
            raise InitError(f"{where} does not exist: install with ca.create=true, or create it")
        if status in (401, 403):
            raise InitError(f"HTTP {status} reading {where}: the service account needs get/patch on it")
        if status != 200:
            time.sleep(min(2**attempt, 10))  # the API or the pod network may not be up yet
            continue
        data = secret.get("data") or {}
        if not isinstance(data, dict):
            raise InitError(f"{where} has a malformed data field")
        add = missing_parts(data, trust_domain)
        if not add:
            return f"{where} already holds a CA and a session key"
        rv = str((secret.get("metadata") or {}).get("resourceVersion", ""))
        if not rv:
            raise InitError(f"{where} has no resourceVersion")
        patch = {
            # The precondition: a replica that wrote since our read makes this a 409.
            "metadata": {"resourceVersion": rv},
            "data": {k: base64.b64encode(v).decode("ascii") for k, v in add.items()},
        }
        status, _ = api.call("PATCH", path, patch)
        if status == 200:
            what = (
                "a new CA and a session key"
                if INDEX in add and SESSION_KEY in add
                else ("a new CA" if INDEX in add else "a session key")
            )
            return f"wrote {what} into {where}"
        if status == 409:
            continue  # another replica wrote first: read again and use what it wrote
        if status in (401, 403):
            raise InitError(f"HTTP {status} writing {where}: the service account needs patch on it")
        time.sleep(min(2**attempt, 10))
    raise InitError(f"could not read and fill {where} in {ATTEMPTS} attempts")


def wait_for(folder: Path, seconds: float) -> None:
    """The kubelet refreshes a mounted Secret some time after it changes (about a minute)."""
    deadline = time.monotonic() + seconds
    while not ((folder / INDEX).is_file() and (folder / SESSION_KEY).is_file()):
        if time.monotonic() >= deadline:
            raise InitError(
                f"{folder} still lacks {INDEX} or {SESSION_KEY} after {seconds:g} s: the CA Secret must "
                "hold both (ca.generate=true writes them; else see the chart README, 'The CA Secret')"
            )
        time.sleep(2)


def check(folder: Path, trust_domain: str) -> str:
    """Load the files the way `nodegate serve` will, so a bad Secret fails here with its reason."""
    try:
        cas = CaStore(folder, trust_domain).load()
    except CaUnavailable as exc:
        raise InitError(str(exc)) from None
    except ValueError as exc:  # an invalid trust domain
        raise InitError(f"trust domain {trust_domain!r}: {exc}") from None
    try:
        keys = sessions.load_keys(folder)
    except (OSError, ValueError) as exc:
        raise InitError(f"session key: {exc}") from None
    n = len(cas.authorities)
    return (
        f"CA ok: trust domain {cas.trust_domain}, signer {cas.signer.stem}, "
        f"{n} authorit{'y' if n == 1 else 'ies'}, {len(keys)} session key(s)"
    )


def main() -> int:
    try:
        name = os.environ["NODEGATE_CA_SECRET"]
        folder = Path(os.environ["NODEGATE_CA_DIR"])
        trust_domain = os.environ["NODEGATE_TRUST_DOMAIN"]
    except KeyError as exc:
        print(f"{PREFIX} environment variable {exc.args[0]} is not set", file=sys.stderr)
        return 2
    generate = os.environ.get("NODEGATE_CA_GENERATE", "false").lower() == "true"
    wait = float(os.environ.get("NODEGATE_CA_WAIT_SECONDS", "300"))
    sa_dir = Path(os.environ.get("NODEGATE_SERVICEACCOUNT_DIR", SERVICE_ACCOUNT))
    try:
        if generate:
            namespace = os.environ.get("POD_NAMESPACE") or (sa_dir / "namespace").read_text().strip()
            print(f"{PREFIX} {ensure_secret(Api(sa_dir), namespace, name, trust_domain)}")
        wait_for(folder, wait)
        print(f"{PREFIX} {check(folder, trust_domain)}")
    except InitError as exc:
        print(f"{PREFIX} {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{PREFIX} {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
