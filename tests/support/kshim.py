"""The tests' kmock shim: it moved to bootstrap/emulator.py so that `nodegate demo` (which runs from
the installed package, without tests/) can use the same emulated Kubernetes API. Re-exported here so
``from tests.support.kshim import ShimEmulator`` keeps working."""

from __future__ import annotations

from bootstrap.demo.emulator import *  # noqa: F403
from bootstrap.demo.emulator import __all__  # noqa: F401  (what the star import re-exports)
