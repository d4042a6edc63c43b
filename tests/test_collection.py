"""Issue 40: a test module builds nothing at import that the installed libraries may refuse.

cryptography 51 refused an empty subjectAltName that a ``parametrize`` list built at import, and
the collection of the whole suite failed. A value a library validates is built when its test runs
(a fixture, a lambda in the parametrize list, a functools.cache'd helper): a refusal then fails
that test. This checks the rule on the source, with no import of the test modules: every call
evaluated when a module is imported (module and class bodies, decorators and their arguments,
default values; not the bodies of functions and lambdas) is resolved through the module's imports
and must not be

- a call into cryptography (certificates, names, extensions, keys, loaders), but for the value
  objects that only hold their arguments (OIDs, hash, padding and curve choices);
- a pydantic validation: ``model_validate*``, or a call of a pydantic model of the product;
- the SPIFFE ID constructor, or one of the test tree's certificate builders.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pydantic

TESTS = Path(__file__).resolve().parent
ALLOWED_CRYPTOGRAPHY = (
    "cryptography.x509.ObjectIdentifier",
    "cryptography.x509.oid.",
    "cryptography.hazmat.primitives.hashes.",
    "cryptography.hazmat.primitives.asymmetric.padding.",
    "cryptography.hazmat.primitives.asymmetric.ec.SECP",
    "cryptography.hazmat.primitives.asymmetric.ec.ECDSA",
)
BUILDERS = {
    "attest.svid.SpiffeId",
    "attest.spiffeid.SpiffeId",
    "tests.support.certs.self_signed",
    "tests.attest.ekbuild.make_ca",
    "tests.attest.ekbuild.ek_pair",
    "tests.attest.ekbuild.issue_ek",
}
PRODUCT = ("attest.", "admission.", "bootstrap.")


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> what it names (``x509`` -> ``cryptography.x509``), from the module's imports."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _at_import(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """The parts of these statements that run when the module is imported."""
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from stmt.decorator_list
            yield from stmt.args.defaults
            yield from (d for d in stmt.args.kw_defaults if d is not None)
        elif isinstance(stmt, ast.ClassDef):
            yield from stmt.decorator_list
            yield from stmt.bases
            yield from stmt.keywords
            yield from _at_import(stmt.body)
        elif isinstance(stmt, ast.If):
            if "__main__" not in ast.unparse(stmt.test):  # a script's entry point is not an import
                yield stmt.test
                yield from _at_import(stmt.body)
                yield from _at_import(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            yield from _at_import(stmt.body)
            for handler in stmt.handlers:
                yield from _at_import(handler.body)
            yield from _at_import(stmt.orelse)
            yield from _at_import(stmt.finalbody)
        elif isinstance(stmt, ast.With):
            yield from stmt.items
            yield from _at_import(stmt.body)
        elif not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            yield stmt


def _calls(node: ast.AST) -> Iterator[ast.Call]:
    """The calls in ``node``, not those inside a function or a lambda (they run later)."""
    if isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
        return
    if isinstance(node, ast.Call):
        yield node
    for child in ast.iter_child_nodes(node):
        yield from _calls(child)


def _is_product_model(qualified: str) -> bool:
    if not qualified.startswith(PRODUCT):
        return False
    module, _, attr = qualified.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return False
    return isinstance(found, type) and issubclass(found, pydantic.BaseModel)


def refused_at_import(source: str, where: str) -> list[str]:
    """``where:line: callee`` for each call in ``source`` that builds a validated object at import."""
    tree = ast.parse(source)
    names = _imports(tree)
    found = []
    for part in _at_import(tree.body):
        for call in _calls(part):
            dotted = _dotted(call.func)
            if dotted is None:
                continue
            head, _, rest = dotted.partition(".")
            qualified = f"{names[head]}.{rest}".rstrip(".") if head in names else dotted
            crypto = qualified.startswith("cryptography.") and not qualified.startswith(ALLOWED_CRYPTOGRAPHY)
            validates = dotted.rpartition(".")[2].startswith("model_validate")
            if crypto or validates or qualified in BUILDERS or _is_product_model(qualified):
                found.append(f"{where}:{call.lineno}: {qualified}")
    return found


_SHOULD_BE_REFUSED = """
import pytest
from cryptography import x509
from admission.reading.policy import PackagePolicy
from attest.svid import SpiffeId
from bootstrap.config import GateSettings
from tests.support.certs import self_signed

NAME = x509.Name([])
_, CA = self_signed("ca")
SETTINGS = GateSettings()
OID = x509.ObjectIdentifier("2.23.133.8.1")


@pytest.mark.parametrize("sid", [SpiffeId("example.org", "/a"), lambda: x509.DNSName("built later")])
def test_x(sid, policy=PackagePolicy.model_validate({})):
    x509.Name([])
"""


def test_no_test_module_builds_validated_objects_at_import() -> None:
    # the check itself finds what it must (else a pass below would prove nothing)
    assert [f.split(": ")[1] for f in refused_at_import(_SHOULD_BE_REFUSED, "sample")] == [
        "cryptography.x509.Name",
        "tests.support.certs.self_signed",
        "bootstrap.config.GateSettings",
        "attest.svid.SpiffeId",
        "admission.reading.policy.PackagePolicy.model_validate",
    ]
    found = [
        finding
        for path in sorted(TESTS.rglob("*.py"))
        for finding in refused_at_import(path.read_text(), str(path.relative_to(TESTS.parent)))
    ]
    assert not found, "built at import (build it in a fixture, a lambda or a cached helper):\n" + "\n".join(
        found
    )
