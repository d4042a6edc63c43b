"""Reading AdmissionReview v1 bodies: the typed models, and the fast path the webhook takes.

Reviews are read with pydantic's JSON parser into plain objects (:func:`read_review`); the models
decide whenever a value is not exactly of its type, and for bodies that are not a review.
``parse_review`` and ``AdmissionRequest`` remain the typed API (``nodegate policy test``); the
decider reads either through the :class:`Request` protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import from_json

from attest import validation


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)


class GroupVersionKind(_Wire):
    group: str = ""
    version: str = ""
    kind: str


class WireUserInfo(_Wire):
    username: str = ""
    uid: str = ""
    groups: list[str] = Field(default_factory=list)
    extra: dict[str, list[str]] = Field(default_factory=dict)


class AdmissionRequest(_Wire):
    uid: str = Field(min_length=1, max_length=256)
    kind: GroupVersionKind
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    name: str = ""
    namespace: str = ""
    sub_resource: str = Field(default="", alias="subResource")
    user_info: WireUserInfo = Field(alias="userInfo")
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = Field(default=None, alias="oldObject")
    dry_run: bool = Field(default=False, alias="dryRun")


class AdmissionReview(_Wire):
    api_version: Literal["admission.k8s.io/v1"] = Field(alias="apiVersion")
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class ReviewError(Exception):
    """A body that is not an AdmissionReview v1 (answered with 400)."""


def parse_review(body: bytes) -> AdmissionReview:
    """Parse and validate in one pass (pydantic's JSON parser, which also bounds nesting)."""
    try:
        return AdmissionReview.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors(include_input=False)[0]
        if first["type"] == "json_invalid":
            raise ReviewError(f"body is not JSON: {first['msg']}") from None
        raise ReviewError(
            f"not an AdmissionReview v1: {validation.problems(exc, AdmissionReview, 1)[0]}"
        ) from None
    except RecursionError:
        raise ReviewError("not an AdmissionReview v1: nested too deeply") from None


# What the decider reads of a request: an AdmissionRequest, or the lighter _Request below.


class RequestKind(Protocol):
    @property
    def group(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def kind(self) -> str: ...


class RequestUser(Protocol):
    @property
    def username(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def groups(self) -> list[str]: ...
    @property
    def extra(self) -> dict[str, list[str]]: ...


class Request(Protocol):
    @property
    def uid(self) -> str: ...
    @property
    def kind(self) -> RequestKind: ...
    @property
    def operation(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def sub_resource(self) -> str: ...
    @property
    def user_info(self) -> RequestUser: ...
    @property
    def object(self) -> dict[str, Any] | None: ...
    @property
    def old_object(self) -> dict[str, Any] | None: ...
    @property
    def dry_run(self) -> bool: ...


@dataclass(slots=True)
class _Kind:
    group: str
    version: str
    kind: str


@dataclass(slots=True)
class _User:
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


@dataclass(slots=True)
class _Request:
    uid: str
    kind: _Kind
    operation: str
    name: str
    namespace: str
    sub_resource: str
    user_info: _User
    object: dict[str, Any] | None
    old_object: dict[str, Any] | None
    dry_run: bool


_OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
# populate_by_name: these would set fields as well, so a review using them goes to the models.
_REVIEW_NAMES = frozenset({"api_version"})
_REQUEST_NAMES = frozenset({"sub_resource", "user_info", "old_object", "dry_run"})


def read_review(body: bytes) -> Request:
    """``parse_review(body).request``, without building its models for a review whose values
    all have exactly their types; others (and bad bodies) go through :func:`parse_review`.

    The JSON parser is pydantic's own (the same acceptance, nesting bound and values), but into
    Python objects directly, which also beats the json module."""
    try:
        doc = from_json(body, cache_strings="keys")  # keys repeat, values rarely: caching them costs
    except ValueError:
        doc = None  # parse_review says why
    request = _exact_request(doc) if type(doc) is dict else None
    return parse_review(body).request if request is None else request


def _exact_request(doc: dict[str, Any]) -> _Request | None:
    req = doc.get("request")
    if (
        doc.get("apiVersion") != "admission.k8s.io/v1"
        or doc.get("kind") != "AdmissionReview"
        or type(req) is not dict
        or not _REVIEW_NAMES.isdisjoint(doc)
        or not _REQUEST_NAMES.isdisjoint(req)
    ):
        return None
    uid, kind, user, operation = req.get("uid"), req.get("kind"), req.get("userInfo"), req.get("operation")
    obj, old, dry_run = req.get("object"), req.get("oldObject"), req.get("dryRun", False)
    # Absent string fields default to "": .get(key, "") and an exact type test, inlined (every review).
    if not (
        type(uid) is str
        and 1 <= len(uid) <= 256
        and type(kind) is dict
        and type(kind.get("kind")) is str
        and type(kind.get("group", "")) is str
        and type(kind.get("version", "")) is str
        and type(operation) is str
        and operation in _OPERATIONS
        and type(req.get("name", "")) is str
        and type(req.get("namespace", "")) is str
        and type(req.get("subResource", "")) is str
        and type(user) is dict
        and type(user.get("username", "")) is str
        and type(user.get("uid", "")) is str
        and (obj is None or type(obj) is dict)
        and (old is None or type(old) is dict)
        and type(dry_run) is bool
    ):
        return None
    groups, extra = user.get("groups", []), user.get("extra", {})
    if type(groups) is not list or type(extra) is not dict:
        return None
    for group in groups:  # plain loops: no generator per review
        if type(group) is not str:
            return None
    for values in extra.values():
        if type(values) is not list:
            return None
        for value in values:
            if type(value) is not str:
                return None
    return _Request(
        uid,
        _Kind(kind.get("group", ""), kind.get("version", ""), kind["kind"]),
        operation,
        req.get("name", ""),
        req.get("namespace", ""),
        req.get("subResource", ""),
        _User(user.get("username", ""), user.get("uid", ""), groups, extra),
        obj,
        old,
        dry_run,
    )
