"""Watch streams: events after a resourceVersion until the server ends the stream.

A stream resumes from the last resourceVersion the caller saw; 410 Gone (the version is too old)
is raised as :class:`WatchExpired` so the caller lists again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import watch as kw
from kubernetes_asyncio.client.rest import ApiException

from bootstrap.kube.errors import KubeUnavailable, WatchExpired

WATCH_SECONDS = 300  # server-side watch timeout; the stream is reopened from the last rv


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: dict[str, Any]


def watch_arguments(resource_version: str) -> dict[str, Any]:
    """The list call's watch arguments: bookmarks on, the server-side timeout, the start version."""
    kwargs: dict[str, Any] = {"allow_watch_bookmarks": True, "timeout_seconds": WATCH_SECONDS}
    if resource_version:
        kwargs["resource_version"] = resource_version
    return kwargs


async def watch_events(
    what: str, list_call: Any, *args: Any, resource_version: str, label_selector: str | None = None
) -> AsyncIterator[WatchEvent]:
    """Events of ``list_call(*args)`` after ``resource_version``. Raises WatchExpired on 410 Gone
    and KubeUnavailable on other failures."""
    # return_type "object": plain dicts; the generated models reject what they do not expect.
    watcher = kw.Watch(return_type="object")
    kwargs = watch_arguments(resource_version)
    if label_selector:
        kwargs["label_selector"] = label_selector
    stream = watcher.stream(list_call, *args, **kwargs)
    try:
        async for event in stream:
            kind = str(event.get("type", ""))
            obj = event.get("raw_object") or event.get("object")
            if kind == "ERROR":
                _raise_watch_error(what, obj)
            if isinstance(obj, dict):
                yield WatchEvent(kind, obj)
    except ApiException as exc:
        if exc.status == 410:
            raise WatchExpired(str(exc.reason)) from None
        raise KubeUnavailable(f"watch {what}: HTTP {exc.status} {exc.reason}") from None
    except (aiohttp.ClientError, OSError, ValueError, KeyError) as exc:  # a malformed line
        raise KubeUnavailable(f"watch {what}: {type(exc).__name__}: {exc}"[:300]) from None
    except Exception as exc:  # kubernetes_asyncio raises bare Exception for malformed events
        if type(exc) is not Exception:
            raise
        raise KubeUnavailable(f"watch {what}: {exc}"[:300]) from None
    finally:
        watcher.stop()
        await watcher.close()


def _raise_watch_error(what: str, obj: object) -> None:
    if isinstance(obj, Mapping) and obj.get("code") == 410:
        raise WatchExpired(str(obj.get("message", "resourceVersion too old")))
    raise KubeUnavailable(f"watch {what}: error event {obj!r}"[:300])
