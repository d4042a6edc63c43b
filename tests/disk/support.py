"""What the disk-key tests share: a service with disk keys on a swtpm's zero PCRs, a joined node,
and the release client pointed at them."""

from __future__ import annotations

import base64
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from cryptography.hazmat.primitives import serialization

from attest import svid
from bootstrap.config import Settings, load_settings
from bootstrap.node.disk.release import Released, ReleaseOptions, release
from bootstrap.node.join import JoinOptions, join
from bootstrap.node.tpm import Agent
from bootstrap.protocol import DISK_FINISH_PATH, DISK_START_PATH, disk_qualifying_data
from tests.support.service import Running
from tests.support.swtpms import TpmInfo

ZERO = "00" * 32
SELECTION = "sha256:0,1,2,3,4,5,6,7"
BOOT_A = "8c1f0b7e-2f6d-4b4f-9c1a-0e5d2a9b7c31"
BOOT_B = "1a2b3c4d-5e6f-4a0b-8c1d-2e3f4a5b6c7d"
VOLUME = "6f1d2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b"


def pcr_class(*tpms: TpmInfo, name: str = "fleet") -> dict[str, Any]:
    """A PCR class the machines ``tpms`` match as they are now, and a fresh swtpm too (PCRs 0-7
    never extended): other tests extend PCRs of the session's shared swtpms."""
    golden: dict[int, set[str]] = {i: {ZERO} for i in range(8)}
    for tpm in tpms:
        with Agent(tpm.tcti) as agent:
            for i, value in agent.read_pcrs(SELECTION)["sha256"].items():
                golden[i].add(value.hex())
    return {"name": name, "golden": {"sha256": {i: sorted(v) for i, v in golden.items()}}}


def settings(tmp: Path, tpm: TpmInfo, *also: TpmInfo, **extra: Any) -> Settings:
    return load_settings(config_file(tmp, tpm, *also, **extra))


def config_file(tmp: Path, tpm: TpmInfo, *also: TpmInfo, **extra: Any) -> Path:
    """The config as ``nodegate serve --config`` and ``nodegate disk`` read it: disk keys for the
    class the machines ``tpm`` and ``also`` boot now."""
    roots = tmp / "ek-roots.pem"
    roots.write_bytes(
        b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (tpm.root, tpm.intermediate))
    )
    doc: dict[str, Any] = {
        "trust_domain": "fleet.test",
        "listen": "127.0.0.1:0",
        "state_dir": str(tmp / "state"),
        "ek_roots": [str(roots)],
        "server_names": ["localhost", "127.0.0.1"],
        "admission": {"listen": "127.0.0.1:0"},
        "pcr_policy": {"bank": "sha256", "pcrs": list(range(8)), "classes": [pcr_class(tpm, *also)]},
        "disk_keys": {"classes": ["fleet"], "require_measured_boot": False},
    }
    doc.update({k: v for k, v in extra.items() if v is not None})
    for key in [k for k, v in extra.items() if v is None]:
        doc.pop(key, None)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def bundle(r: Running, tmp: Path) -> Path:
    path = tmp / "server-ca.pem"
    path.write_bytes(svid.bundle_pem(r.service.cas.roots(datetime.now(UTC))))
    return path


def boot_id(tmp: Path, value: str = BOOT_A) -> Path:
    path = tmp / f"boot_id-{value[:8]}"
    path.write_text(value + "\n")
    return path


async def joined(r: Running, tpm: TpmInfo, tmp: Path, name: str = "disk-node", **kw: Any) -> None:
    await join(
        JoinOptions(
            server=r.base,
            ca_bundle=bundle(r, tmp),
            node_name=name,
            tcti=tpm.tcti,
            out=tmp / f"node-{name}",
            boot_id_file=kw.pop("boot_id_file", boot_id(tmp)),
            attempts=1,
            **kw,
        )
    )


def options(r: Running, tpm: TpmInfo, tmp: Path, name: str = "disk-node", **kw: Any) -> ReleaseOptions:
    base: dict[str, Any] = {
        "server": r.base,
        "ca_bundle": bundle(r, tmp),
        "node_name": name,
        "volume": VOLUME,
        "tcti": tpm.tcti,
        "attempts": 1,
        "boot_id_file": boot_id(tmp),
    }
    base.update(kw)
    return ReleaseOptions(**base)


async def released(r: Running, tpm: TpmInfo, tmp: Path, **kw: Any) -> Released:
    return await release(options(r, tpm, tmp, **kw))


def new_volume() -> str:
    return str(uuid.uuid4())


# -- one exchange by hand: what an attacker (or a test) can send ---------------------------------


async def post(
    http: aiohttp.ClientSession, r: Running, path: str, body: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    async with http.post(r.base + path, json=body) as resp:
        return resp.status, await resp.json(content_type=None)


def tpm_keys(tcti: str) -> tuple[bytes, bytes]:
    """(EK public, AK public) of the TPM behind ``tcti``: the primaries the node client recreates."""
    with Agent(tcti) as agent:
        return agent.create_ek("rsa").public, agent.create_ak().public


def start_body(name: str, ek_public: bytes, volume: str = VOLUME, **extra: Any) -> dict[str, Any]:
    return {"node_name": name, "volume": volume, "ek_public": base64.b64encode(ek_public).decode(), **extra}


def quote_body(
    tcti: str, start: dict[str, Any], name: str, volume: str = VOLUME, boot: str | None = BOOT_A
) -> dict[str, Any]:
    """The finish body a node whose TPM is ``tcti`` sends for the answer ``start``."""
    nonce = base64.b64decode(start["nonce"])
    qualifying = disk_qualifying_data(nonce, name, volume, start["epoch"], start["key_version"], boot)
    with Agent(tcti) as agent:
        ak = agent.create_ak()
        quote, signature, pcrs = agent.quote_with_pcrs(ak, start["pcr_selection"], qualifying)
    return {
        "session": start["session"],
        "quote": base64.b64encode(quote).decode(),
        "signature": base64.b64encode(signature).decode(),
        "pcrs": {bank: {str(i): v.hex() for i, v in sorted(values.items())} for bank, values in pcrs.items()},
        "event_log": None,
        "boot_id": boot,
    }


async def exchange(
    http: aiohttp.ClientSession, r: Running, tcti: str, name: str = "disk-node", **start_extra: Any
) -> tuple[int, dict[str, Any]]:
    """start + finish with the TPM behind ``tcti`` playing the node ``name``."""
    ek, _ak = tpm_keys(tcti)
    volume = start_extra.pop("volume", VOLUME)
    status, start = await post(http, r, DISK_START_PATH, start_body(name, ek, volume, **start_extra))
    if status != 200:
        return status, start
    return await post(http, r, DISK_FINISH_PATH, quote_body(tcti, start, name, volume))


def cli(*args: str) -> list[str]:
    """A ``nodegate`` command line for a subprocess (the service keeps serving in this one)."""
    return [sys.executable, "-m", "bootstrap.cli", *args]
