"""What the HTTP plumbing needs of the running service, as a Protocol under its own app key: the
middleware and the input readers see the settings and the metrics only, so ``http`` does not
import ``bootstrap.service.state`` (which holds the flows built on top of it)."""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from bootstrap.config import Settings
from bootstrap.service.metrics import Metrics


class Plumbing(Protocol):
    @property
    def settings(self) -> Settings: ...

    @property
    def metrics(self) -> Metrics: ...


# compose sets it to the same Service as state.SERVICE.
PLUMBING: web.AppKey[Plumbing] = web.AppKey("plumbing")
