"""The hold gate: pure decisions (``holds``), the controller that applies them (``controller``,
composed of ``cache``, ``lease``, ``writes`` and ``queue``), and ``kubectl nodegate status``."""

from __future__ import annotations

from bootstrap.gate.controller import Gate, GateReport
from bootstrap.gate.lease import LeaseHeld, identity
from bootstrap.gate.writes import camel

__all__ = ["Gate", "GateReport", "LeaseHeld", "camel", "identity"]
