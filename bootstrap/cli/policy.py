"""``nodegate policy test|audit|learn|whatif``: the webhook offline, an audit of existing CRs, a
measured_boot class learned from known-good event logs, and what a policy change would do to the
fleet (``whatif``)."""

from __future__ import annotations

import argparse

from bootstrap.cli import eventlog, whatif
from bootstrap.service.webhook import policycases, policytest


def run(args: argparse.Namespace) -> int:
    if args.policy_command == "whatif":
        return whatif.run(args)
    if args.policy_command == "learn":
        return eventlog.learn(args)
    if args.policy_command == "audit":
        return policytest.audit(args.policy, args.objects)
    sender = policycases.Sender(args.user, tuple(args.group), args.operation)
    return policytest.run(
        args.policy, args.rbac, args.reviews, args.owner, sender, args.expect, output=args.output
    )
