"""The API server's admission chain for package CRs, as the demo plays it against the emulated API
(kmock runs no webhooks): the object goes to nodegate's ``/admission/mutate``, the JSONPatch it
answers is applied, the result goes to ``/admission/validate``, and only an allowed object is
stored. Also the demo's own sample CR, in the shape of NodeWright's simplest example."""

from __future__ import annotations

import base64
import copy
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from bootstrap.demo.manifests import SAMPLE_IMAGE, SAMPLE_NAME, SAMPLE_POOL
from bootstrap.demo.narration import DemoFailed


def sample_cr() -> dict[str, Any]:
    """The demo's own Skyhook CR, written for nodegate in the shape of NodeWright's simplest example
    (one ``shellscript`` package whose apply and check steps are inline scripts, selecting one pool
    by label): what a team applies first. It carries no hold toleration: the mutating webhook adds
    them, which is what step 10 shows."""
    return {
        "apiVersion": "skyhook.nvidia.com/v1alpha1",
        "kind": "Skyhook",
        "metadata": {"name": SAMPLE_NAME, "labels": {"app.kubernetes.io/part-of": "nodegate-demo"}},
        "spec": {
            "nodeSelectors": {"matchLabels": dict(SAMPLE_POOL)},
            "packages": {
                "motd": {
                    "version": "1.0.0",
                    "image": SAMPLE_IMAGE,
                    "configMap": {
                        "apply.sh": "#!/bin/sh\nprintf 'attested by nodegate\\n' > /etc/motd.d/50-nodegate\n",
                        "apply_check.sh": "#!/bin/sh\ngrep -q nodegate /etc/motd.d/50-nodegate\n",
                    },
                }
            },
        },
    }


def apply_patch(doc: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 ``add`` (what the mutating webhook sends), with RFC 6901 pointers, as the API
    server applies it: into objects (a member is set, an existing one replaced) and arrays (``-``
    appends)."""
    out = copy.deepcopy(doc)
    for op in patch:
        if op.get("op") != "add" or not str(op.get("path", "")).startswith("/"):
            raise DemoFailed(f"unexpected patch operation {op}")
        *parents, last = [t.replace("~1", "/").replace("~0", "~") for t in op["path"][1:].split("/")]
        place: Any = out
        for token in parents:
            place = place[int(token)] if isinstance(place, list) else place[token]
        if isinstance(place, list):
            place.insert(len(place) if last == "-" else int(last), op["value"])
        else:
            place[last] = op["value"]
    return out


async def post_review(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(url, json=body) as resp:
        if resp.status != 200:
            raise DemoFailed(f"{url} answered HTTP {resp.status}")
        answer: dict[str, Any] = (await resp.json())["response"]
    return answer


@dataclass(frozen=True)
class Admitted:
    obj: dict[str, Any]  # as it is stored
    added: list[dict[str, Any]]  # what the mutating webhook added
    answer: dict[str, Any]  # the validating webhook's response


async def admit(http: aiohttp.ClientSession, base: str, body: dict[str, Any]) -> Admitted:
    """``body``: the CREATE review of the object as sent. Mutation, then validation."""
    mutation = await post_review(http, f"{base}/admission/mutate", body)
    patch = json.loads(base64.b64decode(mutation["patch"])) if "patch" in mutation else []
    obj = apply_patch(body["request"]["object"], patch)
    added: list[dict[str, Any]] = []
    for op in patch:  # one toleration appended, the list set, or the spec set
        value = op["value"]
        value = value.get("additionalTolerations", []) if op["path"] == "/spec" else value
        added += value if isinstance(value, list) else [value]
    validated = copy.deepcopy(body)
    validated["request"]["object"] = obj
    answer = await post_review(http, f"{base}/admission/validate", validated)
    if not answer.get("allowed"):
        raise DemoFailed(f"{obj['kind']} {obj['metadata']['name']} was denied: {answer.get('status')}")
    return Admitted(obj, added, answer)
