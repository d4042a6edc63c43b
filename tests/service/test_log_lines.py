"""One log line per successful join and renewal, with the node, SPIFFE ID, EK hash and PCR class
as fields; admission lines carry the user and the object as fields, not inside ``msg``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bootstrap.logs.setup import JsonFormatter
from tests.admission.test_webhook import no_reboot, review
from tests.support.package_crs import SAMPLE
from tests.support.service import EkCa, running, settings_for
from tests.support.softnode import join, post


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


async def test_a_join_is_one_line_with_fields(
    tmp_path: Path, ek_ca: EkCa, caplog: pytest.LogCaptureFixture
) -> None:
    node = ek_ca.node("gpu-7")
    with caplog.at_level(logging.INFO, logger="nodegate"):
        async with (
            running(settings_for(tmp_path, ek_ca, admission={"policy_files": []})) as r,
            r.http() as http,
        ):
            status, out = await join(http, r.base, node)
            assert status == 200, out
            status, _ = await post(
                http, f"{r.admission_base}/admission/validate", review(no_reboot(SAMPLE), user="alice")
            )
            assert status == 200
    joined = [r for r in caplog.records if r.getMessage() == "node joined"]
    assert len(joined) == 1
    line = json.loads(JsonFormatter().format(joined[0]))
    assert line["node"] == "gpu-7"
    assert line["spiffe_id"] == "spiffe://fleet.test/node/gpu-7"
    assert len(line["ek_sha256"]) == 64
    assert line["action"] == "join"
    assert "gpu-7" not in line["msg"]
    (admitted,) = [r for r in caplog.records if r.getMessage().startswith("admission ")]
    line = json.loads(JsonFormatter().format(admitted))
    assert line["user"] == "alice"
    assert "alice" not in line["msg"]
    assert line["object"].startswith("skyhook.nvidia.com/Skyhook ")
