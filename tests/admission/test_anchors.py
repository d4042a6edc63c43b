"""Patterns end at the end of the text (issue 21, finding 9).

In Python, ``$`` also matches before a trailing newline, so ``re.match(r"^sha256:[0-9a-f]{64}$",
x)`` admitted ``"sha256:<hex>\\n"`` (``requireDigest`` and the structural digest check). Go's
``regexp`` (NodeWright, the API server) and pydantic's Rust regex end ``$`` at the end of the text.
Every pattern in ``attest/``, ``admission/`` and ``bootstrap/`` is therefore used with
``fullmatch`` (or ends in ``\\Z``), and pydantic ``pattern=`` strings are ``\\A...\\z``. The
behaviour is asserted value by value; the source scan keeps a ``$`` from coming back.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from admission.policies import rules
from admission.reading.checks.identity import valid_name
from admission.reading.checks.images import valid_digest
from admission.reading.policy import LabelSelectorRequirement, PackagePolicy
from admission.syntax.images import ImageError, parse_image
from admission.syntax.labels import key_problem, value_problem
from admission.syntax.quantity import parse_quantity
from admission.syntax.versions import parse_version, strict_semver
from attest.measuredboot.policy import MeasuredBootClass
from attest.pcr import PcrClass

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32
NL = "\n"

CR: dict[str, Any] = {
    "metadata": {"name": "drivers"},
    "spec": {
        "nodeSelectors": {"matchLabels": {"pool": "gpu"}},
        "packages": {"gpu-driver": {"version": "1.0.0", "image": "registry.example.com/drivers"}},
    },
}


def _cr(group: str, sha: str) -> rules.PackageCR:
    doc = copy.deepcopy(CR)
    doc["apiVersion"], doc["kind"] = f"{group}/v1alpha1", rules.PACKAGE_GROUPS[group]
    doc["spec"]["packages"]["gpu-driver"]["containerSHA"] = sha
    parsed = rules.parse_package_cr(doc)
    assert isinstance(parsed, rules.PackageCR)
    return parsed


def _policy(**spec: Any) -> PackagePolicy:
    body = {"apiVersion": "nodegate.io/v1alpha1", "kind": "PackagePolicy", "metadata": {"name": "gpu"}}
    return PackagePolicy.model_validate(
        {**body, "spec": {"nodeSelector": {"matchLabels": {"pool": "gpu"}}, **spec}}
    )


@pytest.mark.parametrize("group", ["skyhook.nvidia.com", "nodewright.nvidia.com"])
def test_require_digest_refuses_a_digest_with_a_trailing_newline(group: str) -> None:
    pinned = _policy(images={"registries": ["registry.example.com"], "requireDigest": True})
    assert rules.policy_violations(_cr(group, DIGEST), pinned) == []
    found = [v.rule for v in rules.policy_violations(_cr(group, DIGEST + NL), pinned)]
    assert found == ["require-digest"]


def test_the_structural_digest_check_refuses_a_trailing_newline() -> None:
    assert rules.structural_violations(_cr("nodewright.nvidia.com", DIGEST)) == []
    found = rules.structural_violations(_cr("nodewright.nvidia.com", DIGEST + NL))
    assert [v.rule for v in found] == ["digest-format"]


@pytest.mark.parametrize(
    "ref",
    [
        f"registry.example.com/x@{DIGEST}{NL}",
        f"registry.example.com/x:1.0{NL}@{DIGEST}",
        f"registry.example.com{NL}/x",
        f"registry.example.com/x{NL}/y",
    ],
)
def test_image_references_with_a_newline_are_refused(ref: str) -> None:
    with pytest.raises(ImageError):
        parse_image(ref)


def test_every_pattern_refuses_a_trailing_newline() -> None:
    assert valid_digest(DIGEST)
    assert not valid_digest(DIGEST + NL)
    assert valid_name("gpu-driver")
    assert not valid_name("gpu-driver" + NL)
    assert parse_version("1.2.3") is not None
    assert parse_version("1.2.3" + NL) is None
    assert strict_semver("1.2.3")
    assert not strict_semver("1.2.3" + NL)
    assert key_problem("example.com/pool") is None
    assert key_problem("example.com/pool" + NL) is not None
    assert key_problem("example.com" + NL + "/pool") is not None
    assert value_problem("gpu") is None
    assert value_problem("gpu" + NL) is not None
    assert parse_quantity("2Gi") == 2**31
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity("2Gi" + NL)


@pytest.mark.parametrize(
    "build",
    [
        lambda name: PcrClass(name=name, golden={"sha256": {0: ("00" * 32,)}}),
        lambda name: MeasuredBootClass(name=name, secure_boot="required"),
        lambda name: _policy(nodeSelector={"matchLabels": {name: "x"}}),
        lambda name: LabelSelectorRequirement(key=name, operator="Exists"),
    ],
)
def test_model_patterns_refuse_a_trailing_newline(build: Any) -> None:
    build("gpu")
    with pytest.raises(ValidationError):
        build("gpu" + NL)


# -- the source scan -------------------------------------------------------------------------

_RE_FUNCS = frozenset(
    {"compile", "match", "search", "fullmatch", "findall", "finditer", "sub", "subn", "split"}
)


def _text(node: ast.AST, strings: dict[str, str]) -> str | None:
    """The literal text of a pattern expression: string constants, f-strings (their literal
    parts), ``+`` of those, and names bound to them in the same module."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        value = node.value
        return value if isinstance(value, str) else value.decode("latin-1")
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v, strings) or "" for v in node.values)
    if isinstance(node, ast.FormattedValue):
        return _text(node.value, strings) or ""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return (_text(node.left, strings) or "") + (_text(node.right, strings) or "")
    if isinstance(node, ast.Name):
        return strings.get(node.id)
    return None


def dollar_anchors(pattern: str) -> bool:
    """Whether a regex has a ``$`` that is an anchor (not escaped, not inside a class)."""
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "^":
                i += 1
            if pattern[i + 1 : i + 2] == "]":  # a leading ] is literal
                i += 1
        elif c == "$":
            return True
        i += 1
    return False


def scan(source: str) -> list[tuple[int, str]]:
    """(line, pattern) of every regex given to the ``re`` module, and of every pydantic
    ``pattern=``, whose text has a ``$`` anchor."""
    tree = ast.parse(source)
    strings: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            text = _text(node.value, strings)
            if text is not None:
                strings[node.targets[0].id] = text
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        args: list[ast.AST] = []
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "re"
            and func.attr in _RE_FUNCS
            and node.args
        ):
            args.append(node.args[0])
        args += [k.value for k in node.keywords if k.arg == "pattern"]
        for arg in args:
            text = _text(arg, strings)
            if text is not None and dollar_anchors(text):
                found.append((node.lineno, text))
    return found


def test_the_scan_finds_dollar_anchors() -> None:
    """The scanner itself: what it must find and what it must leave alone."""
    bad = [
        'import re\nX = re.compile(r"^sha256:[0-9a-f]{64}$")',
        'import re\nK = r"^a" r"b$"\nre.match(K, "ab")',
        'import re\nN = "x"\nre.search(rf"^{N}$", "x")',
        'from pydantic import Field\nname: str = Field(pattern=r"^[a-z]+$")',
        'import re\nre.compile(b"^x$")',
    ]
    good = [
        'import re\nX = re.compile(r"sha256:[0-9a-f]{64}")',
        'import re\nre.compile(r"a\\$b[$]c")',
        'import re\nre.compile(r"x\\Z")',
        'price = "$5"',
    ]
    assert all(scan(src) for src in bad)
    assert not any(scan(src) for src in good)


def test_no_dollar_anchored_pattern_remains() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for top in ("attest", "admission", "bootstrap")
        for path in sorted((ROOT / top).rglob("*.py"))
        for line, text in scan(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "use fullmatch (or \\Z; \\A...\\z in pydantic patterns):\n" + "\n".join(found)
