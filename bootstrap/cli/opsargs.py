"""Arguments of the day-2 commands: ``nodegate config validate|defaults`` and ``nodegate nodes
list|show|revoke|unrevoke|forget``. argparse only, like ``arguments``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Final, TypeAlias

ADMIN_ENV: Final = "NODEGATE_ADMIN_DIR"
SERVER_ENV: Final = "NODEGATE_SERVER"
BUNDLE_ENV: Final = "NODEGATE_CA_BUNDLE"
OUTPUTS: Final = ("table", "json", "yaml")

Sub: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # generic only to mypy


def add_config(sub: Sub) -> None:
    config = sub.add_parser("config", help="check a service config, or print every key with its default")
    csub = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    validate = csub.add_parser(
        "validate", help="list every problem of a config (keys, values, files it names); exit 0 or 2"
    )
    # FILE or --config FILE: every other command takes --config
    validate.add_argument(
        "config", nargs="?", type=Path, metavar="FILE", help="the YAML config of nodegate serve"
    )
    validate.add_argument("--config", dest="config_option", type=Path, metavar="FILE", help="the same")
    csub.add_parser("defaults", help="the full config with every default and one comment per key")


def add_nodes(sub: Sub) -> None:
    nodes = sub.add_parser(
        "nodes", help="list, show, revoke, unrevoke, forget or quarantine nodes (admin API)"
    )
    nsub = nodes.add_subparsers(dest="nodes_command", metavar="ACTION", required=True)
    listing = nsub.add_parser("list", help="every node the store knows, and the damaged records")
    _client(listing)
    _where(listing)
    quarantine = nsub.add_parser(
        "quarantine",
        help="hold every node whose boot matches --where quarantined, until it attests a new boot "
        "the policy allows",
    )
    _client(quarantine)
    _where(quarantine)
    quarantine.add_argument("--reason", required=True, help="why (kept in each node's audit trail)")
    quarantine.add_argument(
        "--dry-run", action="store_true", help="list the nodes it would hold; write nothing"
    )
    show = nsub.add_parser("show", help="one node's record and its recent audit trail")
    _client(show)
    show.add_argument("name", metavar="NODE")
    for action, text in (
        ("revoke", "revoke a node: its renewals are refused and the gate quarantines it"),
        ("unrevoke", "clear a revocation"),
        ("forget", "drop a node's binding so a re-imaged machine (new EK) may join with the name"),
    ):
        p = nsub.add_parser(action, help=text)
        _client(p)
        p.add_argument("name", metavar="NODE")
        p.add_argument("--reason", required=True, help="why (kept in the audit trail)")


def _where(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="only nodes whose boot record matches (docs/fleet.md: digests by prefix); repeatable",
    )


def _client(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", metavar="URL", help=f"the service, https://host:port (default ${SERVER_ENV})")
    p.add_argument(
        "--ca-bundle",
        type=Path,
        metavar="FILE",
        help=f"PEM roots for the server's TLS, e.g. /v1/bundle?format=pem (default ${BUNDLE_ENV})",
    )
    p.add_argument(
        "--admin",
        type=Path,
        metavar="DIR",
        help=f"admin.pem and admin.key from nodegate ca issue-admin (default ${ADMIN_ENV})",
    )
    p.add_argument("-o", "--output", choices=OUTPUTS, default="table")


def add_ek_hash(esub: Sub, default_tcti: str) -> None:
    hsh = esub.add_parser(
        "hash", help="print an EK's SHA-256 (the value allowlists take) from this TPM or a file"
    )
    hsh.add_argument(
        "file",
        nargs="?",
        type=Path,
        metavar="FILE",
        help="an EK certificate (PEM or DER) or TPM2B_PUBLIC; without it: this machine's TPM",
    )
    hsh.add_argument("--tcti", default=default_tcti, help=f"TPM to read (default {default_tcti})")
    hsh.add_argument("--ek", choices=("ecc", "rsa"), default="rsa", help="EK type (default rsa)")
    hsh.add_argument("-o", "--output", choices=("text", "json"), default="text")


def add_policy_test(test: argparse.ArgumentParser) -> None:
    """``policy test``: AdmissionReviews, or plain objects sent by --user/--group, or --expect."""
    test.add_argument("--user", help="who sends a plain object (an AdmissionReview names its own user)")
    test.add_argument(
        "--group", action="append", default=[], metavar="GROUP", help="the sender's groups (repeat)"
    )
    test.add_argument("--operation", choices=("CREATE", "UPDATE", "DELETE"), default="CREATE")
    test.add_argument(
        "--expect",
        type=Path,
        metavar="FILE",
        help="a table of cases with the verdict each should get; prints PASS/FAIL per case",
    )
    test.add_argument(
        "-o",
        "--output",
        choices=("text", "json"),
        default="text",
        help="text: a verdict per file (default); json: the AdmissionReview response, one line per file",
    )
    test.add_argument(
        "reviews", nargs="*", type=Path, metavar="FILE", help="AdmissionReview files or plain objects"
    )
