"""Every command's arguments, in one parser. Imports nothing but argparse and constants, so
``nodegate --help`` (and the parse step of every command) loads no TPM, HTTP or Kubernetes stack."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

from bootstrap.cli import diskargs, opsargs
from bootstrap.config import parse_duration
from bootstrap.logs.setup import LEVEL_ENV, LEVELS
from bootstrap.node.defaults import ATTEMPTS, BOOT_ID, DEFAULT_TCTI, EVENT_LOG, NODE_DIR
from bootstrap.version import describe

PASSPHRASE_ENV: Final = "NODEGATE_BACKUP_PASSPHRASE"  # noqa: S105  (the variable's name)


def _log_level(p: argparse.ArgumentParser, default: object) -> None:
    p.add_argument(
        "--log-level",
        choices=LEVELS,
        default=default,
        help=f"debug, info (default), warning or error; default ${LEVEL_ENV}",
    )


def _config(p: argparse.ArgumentParser, what: str = "the service's config") -> None:
    p.add_argument("--config", type=Path, metavar="FILE", help=what)


def _duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve", help="run the join service, bundle, admin API and admission webhook")
    _config(serve, "YAML config (every key has a default)")
    _log_level(serve, argparse.SUPPRESS)
    serve.add_argument(
        "--insecure-plaintext",
        action="store_true",
        help="development only: plain HTTP, refused unless listen is a loopback address",
    )
    serve.add_argument(
        "--port-file", type=Path, metavar="FILE", help="write the bound port here once listening"
    )
    serve.add_argument(
        "--admission-port-file",
        type=Path,
        metavar="FILE",
        help="write the admission listener's bound port (admission.listen) here once listening",
    )
    serve.add_argument(
        "--new-ca",
        action="store_true",
        help="start a new CA on purpose although the store holds nodes of another (or a lost) CA; "
        "every node must then join again (docs/backup.md)",
    )
    gate = sub.add_parser("gate", help="run the hold-taint controller alone (serve runs it too)")
    _config(gate, "the service's config (kubernetes, gate)")
    _log_level(gate, argparse.SUPPRESS)
    gate.add_argument("--once", action="store_true", help="reconcile every node once and exit")
    gate.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="--once: the report as JSON"
    )
    gate.add_argument(
        "--no-lease",
        action="store_true",
        help="with --once: do not take the leader Lease (only when no other gate can be running)",
    )


def _node_common(p: argparse.ArgumentParser) -> None:
    """--server, --ca-bundle, --tcti, --attempts, --event-log, --boot-id-file: the same for join,
    renew, attest."""
    p.add_argument("--server", required=True, help="join server URL, https://host:port")
    p.add_argument(
        "--ca-bundle",
        required=True,
        type=Path,
        metavar="FILE",
        help="PEM roots to trust for the server's TLS",
    )
    p.add_argument("--tcti", default=DEFAULT_TCTI, help=f"TPM to use (default {DEFAULT_TCTI})")
    p.add_argument(
        "--attempts",
        type=int,
        default=ATTEMPTS,
        help=f"total tries for transient failures (default {ATTEMPTS}); then exit 75",
    )
    p.add_argument(
        "--event-log",
        type=Path,
        metavar="FILE",
        help=f"the measured-boot event log to send (default: {EVENT_LOG} when --tcti is the platform TPM)",
    )
    p.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="json: one object on stdout"
    )
    # For tests and demos that play several machines on one host: each needs its own boot id.
    p.add_argument(
        "--boot-id-file",
        type=Path,
        default=BOOT_ID,
        metavar="FILE",
        help=f"where this boot's id is read (default {BOOT_ID}; another file only for tests and demos)",
    )


def _node_dir(p: argparse.ArgumentParser) -> None:
    help_text = f"what nodegate join --out wrote (default {NODE_DIR})"
    p.add_argument("--dir", type=Path, default=NODE_DIR, metavar="DIR", help=help_text)


def _node(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    join = sub.add_parser("join", help="attest this machine with its TPM and fetch its credentials")
    _node_common(join)
    join.add_argument("--node-name", required=True, help="this node's Kubernetes name")
    join.add_argument(
        "--out",
        type=Path,
        default=NODE_DIR,
        metavar="DIR",
        help=f"where the node key and credentials go (default {NODE_DIR})",
    )
    join.add_argument("--ek", choices=("ecc", "rsa"), default="rsa", help="EK type to use (default rsa)")
    join.add_argument(
        "--ek-cert-file",
        type=Path,
        metavar="FILE",
        help="the EK certificate (DER or PEM) to send instead of the one in NV (fTPMs on air-gapped fleets)",
    )
    join.add_argument(
        "--no-ek-cert-fetch",
        dest="ek_cert_fetch",
        action="store_false",
        help="never fetch an Intel or AMD fTPM's EK certificate from the vendor's service",
    )
    join.add_argument(
        "--ek-cert-service",
        metavar="URL",
        help="base URL of a mirror of the vendor's EK certificate service (default: the vendor's own)",
    )
    renew = sub.add_parser("renew", help="renew this machine's SVID (mTLS + a fresh TPM quote)")
    _node_common(renew)
    _node_dir(renew)
    renew.add_argument(
        "--before",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="renew when the SVID has less than this left, e.g. 20m (default: a third of its lifetime)",
    )
    attest = sub.add_parser(
        "attest", help="prove this boot at once (renew with a fresh quote, or join again)"
    )
    _node_common(attest)
    _node_dir(attest)
    attest.add_argument(
        "--ek", choices=("ecc", "rsa"), default="rsa", help="the EK type the node joined with (default rsa)"
    )


def _ca(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ca = sub.add_parser("ca", help="the service's signing authorities")
    casub = ca.add_subparsers(dest="ca_command", metavar="ACTION", required=True)
    _config(casub.add_parser("rotate", help="add a new signing CA; the old one retires after ca_grace"))
    issue = casub.add_parser("issue-admin", help="issue an admin SVID (key + certificate) for the admin API")
    _config(issue)
    issue.add_argument(
        "--spiffe-id", required=True, help="must be listed in admin.spiffe_ids to grant anything"
    )
    issue.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="writes admin.key and admin.pem (0600)"
    )
    issue.add_argument("--ttl", default="8h", help="lifetime (default 8h)")


def _policy(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    policy = sub.add_parser("policy", help="admission and measured-boot policy tools")
    psub = policy.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    test = psub.add_parser("test", help="judge AdmissionReview files offline; prints one response per file")
    test.add_argument(
        "--policy", action="append", default=[], type=Path, metavar="FILE", help="PackagePolicy YAML"
    )
    test.add_argument("--rbac", action="append", default=[], type=Path, metavar="FILE", help="RBAC manifests")
    test.add_argument(
        "--owner", default="system:serviceaccount:nodegate:nodegate", help="nodegate's username"
    )
    opsargs.add_policy_test(test)
    audit = psub.add_parser(
        "audit",
        help="list existing package CRs (YAML/JSON files, e.g. from kubectl get -o yaml) "
        "that today's policies would refuse",
    )
    audit.add_argument(
        "--policy", action="append", default=[], type=Path, metavar="FILE", help="PackagePolicy YAML"
    )
    audit.add_argument("objects", nargs="+", type=Path, metavar="FILE")
    learn = psub.add_parser("learn", help="write a measured_boot class from known-good nodes' event logs")
    learn.add_argument(
        "--event-log",
        action="append",
        required=True,
        type=Path,
        metavar="FILE",
        help="a known-good node's event log (repeat for several)",
    )
    learn.add_argument("--name", default="learned", help="the class name (default: learned)")
    learn.add_argument(
        "--kernel-cmdlines",
        action="store_true",
        help="also pin grub's kernel command lines (the quote must then cover PCR 8)",
    )
    learn.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    _whatif(psub)
    elog = sub.add_parser("eventlog", help="measured-boot event logs")
    esub = elog.add_subparsers(dest="eventlog_command", metavar="ACTION", required=True)
    inspect = esub.add_parser("inspect", help="parse and replay an event log")
    inspect.add_argument("file", type=Path, metavar="FILE", help="a TCG event log (binary_bios_measurements)")
    inspect.add_argument("-o", "--output", choices=("text", "json"), default="text")
    inspect.add_argument("--events", action="store_true", help="list every event too")
    check = esub.add_parser(
        "check", help="judge one event log by a measured_boot policy, as the service would"
    )
    check.add_argument("--policy", required=True, type=Path, metavar="FILE", help="measured_boot policy YAML")
    check.add_argument("--event-log", required=True, type=Path, metavar="FILE", help="the TCG event log")
    check.add_argument(
        "--pcrs",
        type=Path,
        metavar="FILE",
        help="PCR values a quote covered (tpm2_pcrread YAML, or {bank: {index: hex}}); default: the replay",
    )


def _whatif(psub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    w = psub.add_parser(
        "whatif",
        help="judge every stored boot record (or package CR) by a new policy, offline, before rolling it out",
    )
    new = w.add_argument_group("the new policy (one of)")
    new.add_argument(
        "--config", type=Path, metavar="FILE", help="a new nodegate config: pcr_policy and measured_boot"
    )
    new.add_argument(
        "--measured-boot",
        type=Path,
        metavar="FILE",
        help="a new measured_boot policy alone (a config or the mapping)",
    )
    new.add_argument(
        "--policy",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="new PackagePolicy YAML (repeatable)",
    )
    w.add_argument(
        "--current",
        type=Path,
        metavar="FILE",
        help="the config in force: the baseline (and the store to read)",
    )
    w.add_argument(
        "--records", type=Path, metavar="FILE", help="boot records from `kubectl nodegate boots -o json`"
    )
    w.add_argument(
        "--current-policy",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="today's PackagePolicies (default: the cluster's)",
    )
    w.add_argument(
        "--objects",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="package CRs (default: the cluster's)",
    )
    w.add_argument(
        "--where", action="append", default=[], metavar="FIELD=VALUE", help="only these nodes (docs/fleet.md)"
    )
    w.add_argument("--kubeconfig", metavar="FILE", help="for a kubernetes store or the cluster's CRs")
    w.add_argument("--context", help="the kubeconfig context")
    w.add_argument("-n", "--namespace", default="nodegate", help="nodegate's namespace (dbx Leases)")
    w.add_argument("-o", "--output", choices=("text", "json"), default="text")


class _Several(argparse.Action):
    """``--roots A B`` and ``--allowlist H1 H2``: values accumulate over repeats, and the option
    given last is remembered, so ``nodegate ek check`` can take the positional CERT back from it
    (argparse hands every following word to the option)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        items = [*(getattr(namespace, self.dest, None) or []), *(values or [])]
        setattr(namespace, self.dest, items)
        namespace.several_last = self.dest


def _ek(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ek = sub.add_parser("ek", help="EK certificates and the EK roots that vouch for them")
    esub = ek.add_subparsers(dest="ek_command", metavar="ACTION", required=True)
    check = esub.add_parser(
        "check", help="explain the verdict on one EK certificate: chain, links, tolerated quirks, code"
    )
    check.add_argument(
        "--roots",
        nargs="+",
        action=_Several,
        type=Path,
        default=[],
        metavar="PATH",
        help="PEM or DER files, folders, or the word vendors (as ek_roots in the config; default: vendors)",
    )
    check.add_argument(
        "--allowlist", nargs="+", action=_Several, default=[], metavar="HEX", help="allowlisted EK SHA-256s"
    )
    check.add_argument(
        "--ek-public",
        type=Path,
        metavar="FILE",
        help="the TPM's EK public area (TPM2B_PUBLIC, e.g. tpm2_readpublic -o); without it the "
        "certificate's key is not compared with a TPM's EK",
    )
    check.add_argument("--at", metavar="TIME", help="judge validity at this RFC 3339 time (default: now)")
    check.add_argument(
        "--gce-project",
        nargs="+",
        action=_Several,
        default=[],
        metavar="ID",
        help="as ek_cloud.gce.projects: GCE projects whose vTPM EKs are accepted through Google's CA",
    )
    check.add_argument("cert", nargs="?", type=Path, metavar="CERT", help="the EK certificate (DER or PEM)")
    roots = esub.add_parser(
        "roots",
        help="list the trusted EK CAs (vendor, subject, fingerprint, expiry, source); warn about expiry",
    )
    roots.add_argument(
        "--roots",
        nargs="+",
        type=Path,
        default=[],
        metavar="PATH",
        help="as ek_roots in the config: files, folders, vendors, imported (default: vendors)",
    )
    roots.add_argument(
        "--state-dir",
        type=Path,
        default=Path("/var/lib/nodegate"),
        metavar="DIR",
        help="the service's state_dir: where `imported` and the fetched AIA intermediates are",
    )
    roots.add_argument("--expiring", type=int, default=365, metavar="DAYS", help="warn within DAYS (365)")
    roots.add_argument("--at", metavar="TIME", help="judge expiry at this RFC 3339 time (default: now)")
    roots.add_argument("-o", "--output", choices=("text", "json"), default="text")
    rsub = roots.add_subparsers(dest="roots_command", metavar="ACTION")
    imp = rsub.add_parser("import", help="add EK root CAs you chose, pinned by SHA-256 (docs/ek-roots.md)")
    imp.add_argument("sources", nargs="+", metavar="FILE|DIR|URL")
    imp.add_argument("--sha256", nargs="+", required=True, metavar="HEX", help="the certificates' SHA-256s")
    imp.add_argument("--state-dir", type=Path, default=Path("/var/lib/nodegate"), metavar="DIR")
    imp.add_argument("--cloud", choices=("alibaba", "gce"), help="mark a cloud vTPM CA (needs ek_cloud)")
    imp.add_argument("--vendor", metavar="NAME", help="a label for `nodegate ek roots` (default: imported)")
    imp.add_argument(
        "--allow-private-addresses", action="store_true", help="let a URL reach loopback or private addresses"
    )
    check.add_argument("-o", "--output", choices=("text", "json"), default="text")
    opsargs.add_ek_hash(esub, DEFAULT_TCTI)


class _NoInlinePassphrase(argparse.Action):
    """``--passphrase VALUE`` is refused without echoing VALUE (argparse would print it back as an
    unrecognised argument)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object, **__: object) -> None:
        parser.error(
            "--passphrase is not accepted: the command line is visible to other users (ps, shell "
            f"history); use --passphrase-file FILE or ${PASSPHRASE_ENV}"
        )


def _passphrase(p: argparse.ArgumentParser) -> None:
    # otherwise `--passphrase-f` style prefixes match, and `--passphrase SECRET` would be taken
    # as `--passphrase-file SECRET`, printing SECRET in the "cannot read" message
    p.allow_abbrev = False
    p.add_argument("--passphrase", action=_NoInlinePassphrase, help=argparse.SUPPRESS)
    p.add_argument(
        "--passphrase-file",
        type=Path,
        metavar="FILE",
        help=f"file holding the passphrase (one trailing newline is dropped); default: ${PASSPHRASE_ENV}",
    )


def _backup(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    backup = sub.add_parser(
        "backup", help="CA keys, session keys and the sqlite store in one encrypted archive"
    )
    _config(backup, "the service's config (state_dir, store)")
    backup.add_argument("--out", type=Path, metavar="FILE", required=True, help="the archive to write (0600)")
    _passphrase(backup)
    restore = sub.add_parser("restore", help="restore a backup archive into state_dir")
    _config(restore, "the config of the service to restore")
    restore.add_argument(
        "--archive", type=Path, metavar="FILE", required=True, help="an archive from nodegate backup"
    )
    _passphrase(restore)
    restore.add_argument(
        "--force",
        action="store_true",
        help="restore into a non-empty state_dir, replacing its CA, session keys and store",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nodegate",
        description="TPM-attested node bootstrap, hold gate and package admission for GPU fleets.",
    )
    p.add_argument("--version", action="version", version=describe())
    _log_level(p, None)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("demo", help="attest software TPMs locally and show a refused one")
    _serve(sub)
    _node(sub)
    _ca(sub)
    _policy(sub)
    _backup(sub)
    _ek(sub)
    opsargs.add_config(sub)
    opsargs.add_nodes(sub)
    diskargs.add_disk(sub, _passphrase)
    return p
