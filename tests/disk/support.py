"""What the disk-key tests share: a service with disk keys on a swtpm's zero PCRs, a joined node,
and the release client pointed at them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from attest import svid
from bootstrap.config import Settings, settings_from_obj
from bootstrap.node.disk.release import Released, ReleaseOptions, release
from bootstrap.node.join import JoinOptions, join
from tests.support.service import Running
from tests.support.swtpms import TpmInfo

ZERO = "00" * 32
BOOT_A = "8c1f0b7e-2f6d-4b4f-9c1a-0e5d2a9b7c31"
VOLUME = "6f1d2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b"


def zero_pcr_class(name: str = "fleet") -> dict[str, Any]:
    """A PCR class a fresh swtpm matches: PCRs 0-7 never extended."""
    return {"name": name, "golden": {"sha256": {i: [ZERO] for i in range(8)}}}


def settings(tmp: Path, tpm: TpmInfo, **extra: Any) -> Settings:
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
        "pcr_policy": {"bank": "sha256", "pcrs": list(range(8)), "classes": [zero_pcr_class()]},
        "disk_keys": {"classes": ["fleet"], "require_measured_boot": False},
    }
    doc.update(extra)
    return settings_from_obj(doc)


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
