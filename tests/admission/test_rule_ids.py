"""The rule ids a denial names are listed once (admission/decision/ruleids.py), every
``Violation("id", ...)`` in the code is among them and none is listed that no rule raises, and
docs/admission.md shows exactly that list (issue 34: docs used ids no rule has)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from admission.decision.ruleids import RULE_IDS, markdown_table
from bootstrap import cli

ROOT = Path(__file__).resolve().parents[2]


def _ids_in_code() -> set[str]:
    found: set[str] = set()
    for path in sorted((ROOT / "admission").rglob("*.py")):
        tree = ast.parse(path.read_text())
        # module-level NAME = "rule-id" constants, for Violation(NAME, ...)
        constants = {
            target.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            first = node.args[0]
            if name != "Violation":
                continue
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(first.value)
            elif isinstance(first, ast.Name) and first.id in constants:
                found.add(constants[first.id])
    return found


def test_every_rule_id_in_the_code_is_listed_and_none_else() -> None:
    assert _ids_in_code() == set(RULE_IDS)


def test_the_docs_show_the_list() -> None:
    text = (ROOT / "docs" / "admission.md").read_text()
    begin, end = "<!-- rule-ids:begin -->\n", "<!-- rule-ids:end -->"
    assert text[text.index(begin) + len(begin) : text.index(end)] == markdown_table()


def test_the_docs_and_examples_name_only_real_rule_ids() -> None:
    for path in [
        *(ROOT / "docs").glob("*.md"),
        ROOT / "bootstrap" / "service" / "webhook" / "policycases.py",
    ]:
        for line in path.read_text().splitlines():
            if line.strip().startswith("rules: ["):
                ids = yaml.safe_load(line.split("#", 1)[0].strip())["rules"]
                assert set(ids) <= set(RULE_IDS), (path, line)


def test_an_expect_table_with_an_unknown_rule_id_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cr.yaml").write_text("apiVersion: skyhook.nvidia.com/v1alpha1\nkind: Skyhook\n")
    case = {"name": "c", "object": "cr.yaml", "user": "alice", "expect": "denied"}
    table = tmp_path / "cases.yaml"
    table.write_text(yaml.safe_dump({"cases": [{**case, "rules": ["images.registries"]}]}))
    assert cli.main(["policy", "test", "--expect", str(table)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"nodegate policy test: {table}: case 1: no rule has the id 'images.registries' "
        "(did you mean registry?); the ids are in docs/admission.md"
    )
