"""The server never loads tpm2_pytss (only bootstrap/node/ and bootstrap/demo/ may): a fresh
interpreter imports bootstrap.service.app, then every other module and package of bootstrap.service, and says
after each import whether tpm2_pytss is loaded (so a failure names the module that pulled it in)."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import bootstrap.service

ROOT = Path(__file__).resolve().parents[2]
# walk_packages: the rooms (http, pki, join, admin, webhook, routes) and every module in them.
MODULES = sorted(m.name for m in pkgutil.walk_packages(bootstrap.service.__path__, "bootstrap.service."))

PROBE = """
import importlib, json, sys
seen = []
for name in sys.argv[1:]:
    importlib.import_module(name)
    seen.append([name, "tpm2_pytss" in sys.modules])
print(json.dumps(seen))
"""


def test_the_service_modules_do_not_load_tpm2_pytss() -> None:
    assert "bootstrap.service.app" in MODULES
    order = ["bootstrap.service.app", *(m for m in MODULES if m != "bootstrap.service.app")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *order],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert [name for name, _ in seen] == order
    assert [name for name, loaded in seen if loaded] == []
