"""``nodegate policy test|audit|learn``: the webhook offline, an audit of existing CRs, and a
measured_boot class learned from known-good event logs."""

from __future__ import annotations

import argparse

from bootstrap.cli import eventlog
from bootstrap.service.webhook import policycases, policytest


def run(args: argparse.Namespace) -> int:
    if args.policy_command == "learn":
        return eventlog.learn(args)
    if args.policy_command == "audit":
        return policytest.audit(args.policy, args.objects)
    sender = policycases.Sender(args.user, tuple(args.group), args.operation)
    return policytest.run(
        args.policy, args.rbac, args.reviews, args.owner, sender, args.expect, output=args.output
    )
