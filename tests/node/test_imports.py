"""The node side loads without the server's dependencies: a node image carries aiohttp's client,
tpm2-pytss and cryptography, not the Kubernetes client, Prometheus or aiohttp's server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("kubernetes_asyncio", "prometheus_client", "aiohttp.web")

PROBE = f"""
import json, sys
import bootstrap.node.join, bootstrap.node.renew
print(json.dumps(sorted(m for m in {SERVER_ONLY!r} if m in sys.modules)))
"""


def test_node_side_imports_no_server_dependencies() -> None:
    # A fresh interpreter: this one has loaded the server for other tests.
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        cwd=REPO,
    )
    assert json.loads(out.stdout) == []
