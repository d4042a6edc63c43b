"""What the layout promises (docs/architecture.md): every package ships, modules stay small, the
emulated API is an extra, and the service and the node load only their own stacks."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import setuptools

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PRODUCT = ("attest", "admission", "bootstrap")


def test_pip_install_ships_every_package() -> None:
    found = set(setuptools.find_packages(str(ROOT), **PYPROJECT["tool"]["setuptools"]["packages"]["find"]))
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for top in PRODUCT
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert on_disk <= found


def test_no_product_module_is_over_500_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for top in PRODUCT
        for p in (ROOT / top).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert long == {}


def test_the_emulated_api_is_an_extra() -> None:
    deps = PYPROJECT["project"]["dependencies"]
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert not any(d.startswith("kmock") for d in deps)
    assert any(d.startswith("kmock") for d in extras["demo"])


def test_serve_and_join_load_only_their_own_stacks() -> None:
    """`nodegate serve` never loads the TPM stack or kmock; `nodegate join` never loads the
    Kubernetes client; `nodegate --help` loads neither."""
    probe = (
        "import sys, importlib\n"
        "from bootstrap.cli.arguments import parser\n"
        "parser()\n"
        "light = {m for m in ('tpm2_pytss', 'kubernetes_asyncio', 'kmock') if m in sys.modules}\n"
        "importlib.import_module('bootstrap.cli.serve')\n"
        "serve = {m for m in ('tpm2_pytss', 'kmock') if m in sys.modules}\n"
        "print(sorted(light), sorted(serve))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[] []"
    probe = (
        "import sys, bootstrap.cli.node\nprint('kubernetes_asyncio' in sys.modules, 'kmock' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False False"
