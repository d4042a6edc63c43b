"""Command line: `nodegate` and `kubectl-nodegate`.

Subcommands import what they need when called, so `nodegate --help` loads no TPM or HTTP stack.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bootstrap.cli import eventlog


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nodegate",
        description="TPM-attested node bootstrap, hold gate and package admission for GPU fleets.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("demo", help="attest software TPMs locally and show a refused one")
    serve = sub.add_parser("serve", help="run the join service, bundle, admin API and admission webhook")
    serve.add_argument("--config", type=Path, metavar="FILE", help="YAML config (every key has a default)")
    serve.add_argument(
        "--insecure-plaintext",
        action="store_true",
        help="development only: plain HTTP, refused unless listen is a loopback address",
    )
    serve.add_argument(
        "--port-file", type=Path, metavar="FILE", help="write the bound port here once listening"
    )
    gate = sub.add_parser("gate", help="run the hold-taint controller alone (serve runs it too)")
    gate.add_argument("--config", type=Path, metavar="FILE", help="the service's config (kubernetes, gate)")
    gate.add_argument("--once", action="store_true", help="reconcile every node once and exit")
    gate.add_argument(
        "--no-lease",
        action="store_true",
        help="with --once: do not take the leader Lease (only when no other gate can be running)",
    )
    join = sub.add_parser("join", help="attest this machine with its TPM and fetch its credentials")
    from bootstrap.node import join as joinclient  # noqa: PLC0415  (argument definitions only; no TPM import)

    joinclient.add_arguments(join)
    from bootstrap.node import renew as renewclient  # noqa: PLC0415  (argument definitions only; no TPM import)

    renewclient.add_renew_arguments(
        sub.add_parser("renew", help="renew this machine's SVID (mTLS + a fresh TPM quote)")
    )
    ca = sub.add_parser("ca", help="the service's signing authorities")
    casub = ca.add_subparsers(dest="ca_command", metavar="ACTION", required=True)
    rotate = casub.add_parser("rotate", help="add a new signing CA; the old one retires after ca_grace")
    rotate.add_argument("--config", type=Path, metavar="FILE", help="the service's config")
    issue = casub.add_parser("issue-admin", help="issue an admin SVID (key + certificate) for the admin API")
    issue.add_argument("--config", type=Path, metavar="FILE", help="the service's config")
    issue.add_argument(
        "--spiffe-id", required=True, help="must be listed in admin.spiffe_ids to grant anything"
    )
    issue.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="writes admin.key and admin.pem (0600)"
    )
    issue.add_argument("--ttl", default="8h", help="lifetime (default 8h)")
    policy = sub.add_parser("policy", help="admission policy tools")
    psub = policy.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    test = psub.add_parser("test", help="judge AdmissionReview files offline; prints one response per file")
    test.add_argument(
        "--policy", action="append", default=[], type=Path, metavar="FILE", help="PackagePolicy YAML"
    )
    test.add_argument("--rbac", action="append", default=[], type=Path, metavar="FILE", help="RBAC manifests")
    test.add_argument(
        "--owner", default="system:serviceaccount:nodegate:nodegate", help="nodegate's username"
    )
    test.add_argument("reviews", nargs="+", type=Path, metavar="REVIEW")
    audit = psub.add_parser(
        "audit",
        help="list existing package CRs (YAML/JSON files, e.g. from kubectl get -o yaml) "
        "that today's policies would refuse",
    )
    audit.add_argument(
        "--policy", action="append", default=[], type=Path, metavar="FILE", help="PackagePolicy YAML"
    )
    audit.add_argument("objects", nargs="+", type=Path, metavar="FILE")
    eventlog.add_learn_arguments(
        psub.add_parser("learn", help="write a measured_boot class from known-good nodes' event logs")
    )
    elog = sub.add_parser("eventlog", help="measured-boot event logs")
    esub = elog.add_subparsers(dest="eventlog_command", metavar="ACTION", required=True)
    eventlog.add_inspect_arguments(esub.add_parser("inspect", help="parse and replay an event log"))
    from bootstrap.store import backup  # noqa: PLC0415  (argument definitions; no TPM or HTTP import)

    backup.add_backup_arguments(
        sub.add_parser("backup", help="CA keys, session keys and the sqlite store in one encrypted archive")
    )
    backup.add_restore_arguments(sub.add_parser("restore", help="restore a backup archive into state_dir"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "eventlog":
        return eventlog.inspect(args)
    if args.command == "policy" and args.policy_command == "learn":
        return eventlog.learn(args)
    if args.command == "policy":
        from bootstrap.service import policyfiles as policytool  # noqa: PLC0415

        if args.policy_command == "audit":
            return policytool.audit(args.policy, args.objects)
        return policytool.run(args.policy, args.rbac, args.reviews, args.owner)
    if args.command == "serve":
        return _serve(args.config, args.insecure_plaintext, args.port_file)
    if args.command == "gate":
        return _gate(args.config, once=args.once, lease=not args.no_lease)
    if args.command == "join":
        from bootstrap.node import join as joinclient  # noqa: PLC0415

        _node_log("join")
        return joinclient.main(args)
    if args.command == "renew":
        from bootstrap.node import renew as renewclient  # noqa: PLC0415

        _node_log("renew")
        return renewclient.renew_main(args)
    if args.command == "ca" and args.ca_command == "issue-admin":
        return _issue_admin(args.config, args.spiffe_id, args.out, args.ttl)
    if args.command == "ca":
        return _rotate(args.config)
    if args.command == "demo":
        from bootstrap.demo.scenario import run  # noqa: PLC0415  (keeps `nodegate --help` free of tpm2-pytss)

        return run()
    from bootstrap.store import backup  # noqa: PLC0415

    if args.command == "backup":
        return backup.cli_backup(args)
    return backup.cli_restore(args)


def _node_log(command: str) -> None:
    """The node commands print retry notices on stderr, one plain line each."""
    import logging  # noqa: PLC0415

    from bootstrap.logs import StderrHandler  # noqa: PLC0415

    handler = StderrHandler()
    handler.setFormatter(logging.Formatter(f"nodegate {command}: %(message)s"))
    logger = logging.getLogger(f"nodegate.{command}")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.WARNING)
    logger.propagate = False


def _settings(config: Path | None) -> Any:
    from bootstrap.config import ConfigError, Settings, load_settings  # noqa: PLC0415

    try:
        return load_settings(config) if config is not None else Settings()
    except ConfigError as exc:
        print(f"nodegate: {exc}", file=sys.stderr)
        return None


def _serve(config: Path | None, plaintext: bool, port_file: Path | None) -> int:
    import asyncio  # noqa: PLC0415

    from bootstrap import logs  # noqa: PLC0415
    from bootstrap.kube import KubeUnavailable  # noqa: PLC0415
    from bootstrap.service import app as server  # noqa: PLC0415

    settings = _settings(config)
    if settings is None:
        return 2
    logs.configure()

    def ready(port: int) -> None:
        if port_file is not None:
            server.write_port(port_file, port)

    try:
        asyncio.run(server.serve(settings, insecure_plaintext=plaintext, ready=ready))
    except (ValueError, OSError, KubeUnavailable) as exc:  # a bad listen, unreadable files, no cluster
        print(f"nodegate serve: {exc}", file=sys.stderr)
        return 2
    return 0


def _gate(config: Path | None, *, once: bool, lease: bool) -> int:
    """Exit codes: 0 done (or stopped by a signal), 1 a pass with errors, 2 config or cluster
    errors, 3 another gate holds the Lease (--once)."""
    import asyncio  # noqa: PLC0415

    from bootstrap import logs  # noqa: PLC0415
    from bootstrap.kube import KubeUnavailable  # noqa: PLC0415

    settings = _settings(config)
    if settings is None:
        return 2
    logs.configure()
    try:
        return asyncio.run(_gate_async(settings, once=once, lease=lease))
    except KubeUnavailable as exc:  # KubeConfigError: a kubeconfig that cannot be used
        print(f"nodegate gate: {exc}", file=sys.stderr)
        return 2


async def _gate_async(settings: Any, *, once: bool, lease: bool) -> int:
    import asyncio  # noqa: PLC0415
    import contextlib  # noqa: PLC0415
    import signal  # noqa: PLC0415

    from bootstrap.gate import Gate, LeaseHeld  # noqa: PLC0415
    from bootstrap.kube import Kube  # noqa: PLC0415

    kube = await Kube.from_settings(settings.kubernetes)
    if kube is None:
        print(
            "nodegate gate: no cluster: set kubernetes.kubeconfig in the config, or run in a pod",
            file=sys.stderr,
        )
        return 2
    gate = Gate.for_settings(kube, settings)
    try:
        if once:
            try:
                report = await gate.once(lease=lease)
            except LeaseHeld as exc:
                print(f"nodegate gate --once: {exc}", file=sys.stderr)
                return 3
            print(_report_line(report))
            for error in report.errors:
                print(f"nodegate gate --once: {error}", file=sys.stderr)
            return 1 if report.errors else 0
        task = asyncio.get_running_loop().create_task(gate.run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task  # run() gives the Lease back when cancelled
        return 0
    finally:
        await kube.close()


def _report_line(report: Any) -> str:
    held = ", ".join(f"{reason} {n}" for reason, n in sorted(report.held.items())) or "none"
    return f"{report.nodes} nodes: {report.released} released; held: {held}; {report.writes} writes"


def _rotate(config: Path | None) -> int:
    from datetime import UTC, datetime  # noqa: PLC0415

    from bootstrap.service.authority import CaStore, CaUnavailable  # noqa: PLC0415

    settings = _settings(config)
    if settings is None:
        return 2
    store = CaStore(settings.state_dir / "ca", settings.trust_domain)
    now = datetime.now(UTC)
    try:
        rotated = store.rotate(now, settings.ca_grace)
    except CaUnavailable as exc:
        print(f"nodegate ca rotate: {exc}", file=sys.stderr)
        return 1
    old = [a for a in rotated.authorities if a is not rotated.signer]
    print(f"new signer {rotated.signer.stem}; bundle sequence {rotated.bundle_sequence(now)}")
    for a in old:
        print(f"  {a.stem} stays in the bundle until {a.retire_at.isoformat() if a.retire_at else 'expiry'}")
    return 0


def _issue_admin(config: Path | None, spiffe_id: str, out: Path, ttl: str) -> int:
    from datetime import UTC, datetime  # noqa: PLC0415

    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    from attest import svid  # noqa: PLC0415
    from bootstrap.config import parse_duration  # noqa: PLC0415
    from bootstrap.files import ensure_dir, write_atomic  # noqa: PLC0415
    from bootstrap.service.authority import CaStore, CaUnavailable  # noqa: PLC0415

    settings = _settings(config)
    if settings is None:
        return 2
    try:
        sid = svid.parse_spiffe_id(spiffe_id)
        lifetime = parse_duration(ttl)
        cas = CaStore(settings.state_dir / "ca", settings.trust_domain).load()
    except (ValueError, CaUnavailable) as exc:
        print(f"nodegate ca issue-admin: {exc}", file=sys.stderr)
        return 2
    if spiffe_id not in settings.admin.spiffe_ids:
        print(f"nodegate ca issue-admin: note: {spiffe_id} is not in admin.spiffe_ids; it grants nothing yet")
    key = ec.generate_private_key(ec.SECP256R1())
    try:
        leaf = svid.issue_svid(
            cas.signer, spiffe_id=sid, public_key=key.public_key(), now=datetime.now(UTC), ttl=lifetime
        )
    except ValueError as exc:
        print(f"nodegate ca issue-admin: {exc}", file=sys.stderr)
        return 2
    ensure_dir(out)
    write_atomic(
        out / "admin.key",
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    write_atomic(out / "admin.pem", leaf.public_bytes(serialization.Encoding.PEM))
    until = leaf.not_valid_after_utc.isoformat()
    print(f"{sid}: {out / 'admin.pem'} (key {out / 'admin.key'}), valid until {until}")
    return 0


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl nodegate status ...`` (kubectl finds ``kubectl-nodegate`` on PATH)."""
    from bootstrap.gate import kubectl  # noqa: PLC0415

    return kubectl.main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
