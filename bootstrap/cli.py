"""Command line: `nodegate` and `kubectl-nodegate`.

Only `nodegate demo` does real work so far (the attestation core on software TPMs); the service,
join client, gate and policy commands arrive with their issues and say so when called.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

_PENDING = {
    "serve": "the join service (issue 3)",
    "join": "the node join client (issue 3)",
    "gate": "the hold-taint controller (issue 4)",
    "ca": "CA rotation (issue 3)",
    "backup": "backup and restore (issue 6)",
    "restore": "backup and restore (issue 6)",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nodegate",
        description="TPM-attested node bootstrap, hold gate and package admission for GPU fleets.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("demo", help="attest software TPMs locally and show a refused one")
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
    for name, what in _PENDING.items():
        sub.add_parser(name, help=f"{what}; not built yet")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "policy":
        from bootstrap import policytool  # noqa: PLC0415

        if args.policy_command == "audit":
            return policytool.audit(args.policy, args.objects)
        return policytool.run(args.policy, args.rbac, args.reviews, args.owner)
    if args.command == "demo":
        from bootstrap.demo import run  # noqa: PLC0415  (keeps `nodegate --help` free of tpm2-pytss)

        return run()
    print(f"nodegate {args.command}: {_PENDING[args.command]} is not built yet.", file=sys.stderr)
    return 2


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kubectl nodegate", description="Why nodes are held.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("status", help="nodes, hold reasons and what each waits for; not built yet")
    args = p.parse_args(argv)
    if args.command is None:
        p.print_help()
        return 0
    print("kubectl nodegate status: arrives with the hold gate (issue 4).", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
