"""PackagePolicy and RBAC manifests from YAML/JSON files: for the server (``admission.policy_files``,
``admission.rbac_files``) and for the offline ``nodegate policy test`` / ``audit``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from admission.rbac.evaluator import RbacError, RbacEvaluator
from admission.reading.policy import PackagePolicy
from attest import validation, yamlsafe

MAX_FILE = 8 * 1024 * 1024


class ToolError(Exception):
    """An input file that cannot be used; the message names it."""


def documents(path: Path) -> Iterator[Any]:
    """The documents of a YAML/JSON file, the items of a ``*List`` in their place."""
    try:
        if path.stat().st_size > MAX_FILE:
            raise ToolError(f"{path}: larger than {MAX_FILE} bytes")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ToolError(f"{path}: {exc.strerror}") from None
    try:
        for doc in yamlsafe.load_all(text):
            if doc is None:
                continue
            if (
                isinstance(doc, dict)
                and isinstance(doc.get("items"), list)
                and str(doc.get("kind", "")).endswith("List")
            ):
                yield from doc["items"]
            else:
                yield doc
    except yaml.YAMLError as exc:
        raise ToolError(f"{path}: not YAML/JSON: {yamlsafe.describe(exc)}") from None


def load_policies(paths: Sequence[Path]) -> list[PackagePolicy]:
    out = []
    for path in paths:
        for doc in documents(path):
            try:
                out.append(PackagePolicy.model_validate(doc))
            except ValidationError as exc:
                raise ToolError(
                    f"{path}: not a PackagePolicy: {validation.summary(exc, PackagePolicy)}"
                ) from None
    return out


def load_rbac(paths: Sequence[Path]) -> RbacEvaluator:
    try:
        return RbacEvaluator.from_objects([doc for p in paths for doc in documents(p)])
    except RbacError as exc:
        raise ToolError(f"RBAC manifests: {exc}") from None
