"""What the layout promises (docs/architecture.md): every package ships, modules stay small, the
emulated API is an extra, and the service and the node load only their own stacks."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

from bootstrap.service.join.ekroots import STORE_ENV
from tests.support.ekvendors import vendor_folder
from tests.support.shared_data import shared

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("attest", "admission", "bootstrap")


@functools.cache
def pyproject() -> dict[str, Any]:
    """pyproject.toml, read when a test asks (not at import: a file that does not parse fails those
    tests, not the collection)."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_pip_install_ships_every_package() -> None:
    import setuptools  # imported here: without it this test fails, not the collection of the suite

    found = set(setuptools.find_packages(str(ROOT), **pyproject()["tool"]["setuptools"]["packages"]["find"]))
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
    deps = pyproject()["project"]["dependencies"]
    extras = pyproject()["project"]["optional-dependencies"]
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


WHEEL_PROBE = """
import sys
from pathlib import Path
import bootstrap
from attest import tpm
from bootstrap.config import settings_from_obj
from bootstrap.service.join import ekroots
from tests.support.ekvendors import AIA_INTERMEDIATES, GOOGLE_EKS, MAKERS_EKS, collection_certs, real_ek

assert Path(bootstrap.__file__).is_relative_to(sys.argv[1]), bootstrap.__file__
trust = ekroots.load_ek_trust(settings_from_obj({"trust_domain": "example.org", "ek_roots": ["vendors"]}))
assert trust.skipped == (), trust.skipped
# what AIA would fetch (tests/service/test_ek_aia.py fetches it): intermediates only, never anchors
fetched = [c for name in AIA_INTERMEDIATES.values() for c in collection_certs(name)]
for name in [*MAKERS_EKS, *GOOGLE_EKS]:
    ek = real_ek(name)
    try:
        ident = tpm.verify_ek(ek.ek_public, ek.der, roots=trust.roots,
                              intermediates=(*trust.intermediates, *fetched))
    except tpm.AttestationError as exc:
        print(name, exc.code)
    else:
        print(name, ident.trusted_by.split(",")[0])
"""


def test_a_wheel_ships_no_certificate_and_trusts_real_eks_with_vendors_from_the_package(
    tmp_path: Path,
) -> None:
    """`pip install nodegate` (a wheel, not this checkout) carries no certificate; with Debian's
    ruby-tpm-key-attestation where `vendors` looks, it trusts real STMicro, Infineon, Nuvoton and
    Intel PTT EKs (their intermediates as AIA would fetch them), and no Google Cloud vTPM's."""
    shared("tpm").require()  # the real EK certificates: public test data
    out = tmp_path / "wheel"
    # `make wheel`'s way: from the tracked files, in a copy (a stale build/lib would leak into a
    # wheel pip builds in the checkout)
    subprocess.run(
        [sys.executable, "scripts/image/build.py", "--wheel-only", "--out", str(out)],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    (wheel,) = out.glob("nodegate-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert not [n for n in names if n.endswith((".pem", ".crt", ".cer", ".der"))]
        site = tmp_path / "site"
        zf.extractall(site)
    tests_link = site / "tests"
    tests_link.symlink_to(ROOT / "tests")  # the probe reads the test data, nothing else from the checkout
    env = {**os.environ, "PYTHONPATH": str(site), STORE_ENV: str(vendor_folder())}
    probe = subprocess.run(
        [sys.executable, "-c", WHEEL_PROBE, str(site)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env=env,
    )
    trusted = dict(line.split(" ", 1) for line in probe.stdout.splitlines())
    assert trusted["ek/stmicro-ek-rsa.der"] == "chain:CN=GlobalSign Trusted Platform Module Root CA"
    assert trusted["ek/infineon-ek-ecc-mfr-ca022.der"] == "chain:CN=Infineon OPTIGA(TM) ECC Root CA"
    assert trusted["ftpm/intel-ptt-ek-rsa-answer.json"] == "chain:CN=www.intel.com"
    nuvoton = "chain:C=TW+CN=Nuvoton TPM Root CA {}+O=Nuvoton Technology Corporation"
    assert trusted["ek/nuvoton-ek-rsa-root1110.der"] == nuvoton.format(1110)
    assert trusted["ek/nuvoton-ek-rsa-root2111.der"] == nuvoton.format(2111)
    assert trusted["ek/google-ek-rsa-ekak-ca.pem"] == "ek_untrusted"
    assert len(trusted) == 13
    assert sum(v.startswith("chain:") for v in trusted.values()) == 9
