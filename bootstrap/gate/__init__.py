"""The hold gate: pure decisions (``holds``), the controller that applies them, and
``kubectl nodegate status``."""

from __future__ import annotations

from bootstrap.gate.controller import Gate, GateReport, LeaseHeld, camel, identity

__all__ = ["Gate", "GateReport", "LeaseHeld", "camel", "identity"]
