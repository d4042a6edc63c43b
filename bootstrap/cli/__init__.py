"""Command line entry points: ``nodegate`` and ``kubectl-nodegate``."""

from __future__ import annotations

from bootstrap.cli.main import kubectl_main, main

__all__ = ["kubectl_main", "main"]
