"""docs/troubleshooting.md lists every machine code the code can produce (server and node side)
and no code that does not exist; docs/operations.md's table of metrics is what /metrics serves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import attest.errors
from bootstrap.node import client
from bootstrap.service.fleetmetrics import FleetCollector
from tests.support.service import EkCa, running, settings_for

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
_ROW = re.compile(r"^\| ((?:`[a-z_]+`(?:, )?)+) \|", re.MULTILINE)  # a row's first cell: codes
_NODE_CODE = re.compile(r"(?:JoinFailed|_Transient|JoinGaveUp)\(\s*\"([a-z_]+)\"")


# raised only where a SPIFFE bundle is read (by clients), never in an answer of the service
NOT_SENT = {"bundle_invalid"}


def _all_subclasses(base: type) -> set[type]:
    out = set()
    for sub in base.__subclasses__():
        out |= {sub, *_all_subclasses(sub)}
    return out


def server_codes() -> set[str]:
    """Codes of every exception the service turns into problem+json (bootstrap.service loads every
    module that defines one)."""
    import bootstrap.service.compose

    bases = (attest.errors.AttestationError, bootstrap.problems.ServiceError)
    return {c.code for base in bases for c in _all_subclasses(base)} - {b.code for b in bases} - NOT_SENT


def node_codes() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "bootstrap" / "node").rglob("*.py"):
        found |= set(_NODE_CODE.findall(path.read_text()))
    return found | set(client._STATUS_CODES.values()) | {"server_error"}  # 5xx without a problem


def _codes(section: str) -> set[str]:
    return {code for cell in _ROW.findall(section) for code in re.findall(r"`([a-z_]+)`", cell)}


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end > 0 else None]


def test_every_code_is_in_troubleshooting_and_every_listed_code_exists() -> None:
    text = (DOCS / "troubleshooting.md").read_text()
    server_rows = _codes(_section(text, "## Machine codes"))
    node_rows = _codes(_section(text, "## Node-side codes"))
    assert server_codes() - server_rows == set(), "server codes missing from troubleshooting.md"
    assert node_codes() - node_rows - server_rows == set(), "node codes missing from troubleshooting.md"
    assert server_rows - server_codes() == set(), "troubleshooting.md lists server codes the code never sends"
    assert node_rows - node_codes() == set(), "troubleshooting.md lists node codes the code never sets"


# -- metrics -------------------------------------------------------------------------------------

_DOC_METRIC = re.compile(r"^\| `(nodegate_[a-z_]+)(?:\{[^}]*\})?` \|", re.MULTILINE)
GATE_ONLY = {
    "nodegate_held_nodes",
    "nodegate_gate_reconcile_errors_total",
    "nodegate_gate_backlog",
    "nodegate_gate_synced",
    "nodegate_gate_leader",
}  # served only where the gate runs (a cluster and gate.enabled)


def documented_metrics() -> set[str]:
    text = (DOCS / "operations.md").read_text()
    return set(_DOC_METRIC.findall(_section(text, "### Metrics reference")))


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


async def test_the_metrics_table_is_what_metrics_serves(tmp_path: Path, ek_ca: EkCa) -> None:
    async with running(settings_for(tmp_path, ek_ca)) as r:
        text = r.service.metrics.render().decode()
    served = {
        line.split()[2]
        for line in text.splitlines()
        if line.startswith("# TYPE ") and not line.split()[2].endswith("_created")
    }
    assert documented_metrics() - GATE_ONLY == served
    assert documented_metrics() >= GATE_ONLY
    names = FleetCollector.collect.__code__.co_consts  # the gate-only ones are real
    assert {
        "nodegate_held_nodes",
        "nodegate_gate_reconcile_errors",
        "nodegate_gate_backlog",
        "nodegate_gate_synced",
        "nodegate_gate_leader",
    } <= set(names)


# -- the startup lines troubleshooting.md quotes are lines the code prints -------------------------

_PLACEHOLDER = re.compile(r"\.\.\.|\bKEY\b|\bPATH\b|HOST:PORT|\bHOST\b|\bN\b|\.\.\./|\(\.\.\.\)")


def _fragments(quoted: str) -> list[str]:
    """The literal pieces of a quoted line (placeholders and paths cut out), long enough to mean
    something."""
    out: list[str] = []
    for piece in _PLACEHOLDER.split(quoted):
        # a file name or path in the line is the program's variable, not its text
        words: list[str] = []
        for word in [*piece.split(" "), "/"]:
            if "/" in word or "*" in word or re.search(r"\.(json|db|id|key|pem)$", word):
                chunk = " ".join(words).strip(" .,;:")
                if len(chunk) >= 10:
                    out.append(chunk)
                words = []
            else:
                words.append(word)
    return out


# pieces the code composes from parts ("the {what} {path}", "{given} is set but {missing} is not")
# or takes from a library (sqlite's own message); each was checked by hand against the code
COMPOSED = {
    "sqlite: file is not a database",
    "ek_roots: the folder",
    "the root store",
    "tls.cert_file is set but tls.key_file is not",
}


def test_every_startup_line_in_troubleshooting_is_printed_by_the_code() -> None:
    text = (DOCS / "troubleshooting.md").read_text()
    section = _section(text, "## The service does not start")
    quoted = [
        q
        for row in section.splitlines()
        if row.startswith("| `")
        for q in re.findall(r"`([^`]+)`", row.split(" | ")[0])
    ]
    assert len(quoted) >= 15
    source = "\n".join(p.read_text() for p in (ROOT / "bootstrap").rglob("*.py"))
    source += "\n".join(p.read_text() for p in (ROOT / "attest").rglob("*.py"))
    # f-strings split lines at their placeholders; compare without the braces' content
    plain = re.sub(r"\{[^{}]*\}", " ", source)
    missing = [
        f for q in quoted for f in _fragments(q) if f not in source and f not in plain and f not in COMPOSED
    ]
    assert missing == [], missing
