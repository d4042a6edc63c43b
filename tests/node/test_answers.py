"""The service's answers as the node parses them (bootstrap.protocol): what the node hands its TPM
is checked first, unknown fields are ignored, and what the service builds parses back."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest
from pydantic import ValidationError

from bootstrap.protocol import FinishResponse, Problem, RenewStartResponse, StartResponse
from bootstrap.times import rfc3339


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def start(**changes: Any) -> dict[str, Any]:
    doc = {
        "session": "s" * 100,
        "credential_blob": b64(os.urandom(70)),
        "encrypted_secret": b64(os.urandom(258)),
        "nonce": b64(os.urandom(32)),
        "pcr_selection": "sha256:0,1,2,3,4,5,6,7",
        "expires_at": "2030-01-01T00:00:00Z",
        "something_new": "ignored",
    }
    return doc | changes


def test_built_answers_parse_back() -> None:
    built = StartResponse(
        session="t",
        credential_blob=b"b",
        encrypted_secret=b"e",
        nonce=os.urandom(32),
        pcr_selection="sha256:0,7",
        expires_at=rfc3339(0),
    )
    assert StartResponse.model_validate_json(built.model_dump_json()) == built
    fin = FinishResponse(
        node_name="n",
        spiffe_id="spiffe://example.org/node/n",
        svid="pem",
        bundle="pem",
        svid_expires_at=rfc3339(0),
        kubeconfig=None,
    )
    assert FinishResponse.model_validate_json(fin.model_dump_json()) == fin


@pytest.mark.parametrize("model", [StartResponse, RenewStartResponse])
def test_start_answers(model: type[StartResponse] | type[RenewStartResponse]) -> None:
    assert len(model.model_validate(start()).nonce) == 32
    for bad in (
        {"nonce": b64(os.urandom(31))},
        {"nonce": b64(os.urandom(33))},
        {"nonce": "not base64!"},
        {"pcr_selection": "sha256:0,24"},
        {"pcr_selection": "md5:0"},
        {"session": ""},
        {"session": "s" * 8193},
    ):
        with pytest.raises(ValidationError):
            model.model_validate(start(**bad))


def test_finish_answer_kubeconfig_is_optional_and_sizes_are_capped() -> None:
    doc = {
        "node_name": "n",
        "spiffe_id": "spiffe://example.org/node/n",
        "svid": "pem",
        "bundle": "pem",
        "svid_expires_at": "2030-01-01T00:00:00+00:00",
    }
    assert FinishResponse.model_validate(doc).kubeconfig is None
    with pytest.raises(ValidationError):
        FinishResponse.model_validate(doc | {"svid_expires_at": "2030-01-01T00:00:00Z" + " " * 60})
    with pytest.raises(ValidationError):
        FinishResponse.model_validate(doc | {"spiffe_id": "spiffe://example.org/" + "x" * 2048})


def test_problem_codes_are_machine_codes() -> None:
    assert Problem.model_validate({"code": "session_expired", "status": 403}).code == "session_expired"
    with pytest.raises(ValidationError):
        Problem.model_validate({"code": "Not A Code"})
