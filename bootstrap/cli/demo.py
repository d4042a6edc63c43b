"""``nodegate demo``: the whole story on software TPMs and an emulated API (extra nodegate[demo])."""

from __future__ import annotations

import argparse

from bootstrap.demo.scenario import run as run_demo


def run(args: argparse.Namespace) -> int:
    del args
    return run_demo()
