"""The nodegate service's public surface: the join and renewal API, the trust bundle, the admin
API and the admission webhook on one listener (docs/architecture.md, docs/protocol.md).

``build_service`` wires the parts from the config and ``make_app`` puts HTTP around them
(``bootstrap.service.compose``); ``serve`` runs it (``bootstrap.service.serve``). One middleware
(``bootstrap.service.http.middleware``) turns every failure into ``application/problem+json`` with a
machine code; nothing reaches the client as a 500 or a traceback.
"""

from __future__ import annotations

from bootstrap.service.compose import build_service, make_app, tls_context
from bootstrap.service.serve import serve, write_port
from bootstrap.service.state import SERVICE, Service

__all__ = ["SERVICE", "Service", "build_service", "make_app", "serve", "tls_context", "write_port"]
