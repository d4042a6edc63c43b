"""Pack a root file system folder into an OCI image, byte for byte the same for the same folder.

One layer: a tar of the folder with entries in sorted order, every timestamp set to
SOURCE_DATE_EPOCH, numeric owners only (no user or group names), no access/change times, no
extended attributes, and gzip with a zero header time. The image is written twice over:

  <out>/oci/            an OCI image layout (oci-layout, index.json, blobs/sha256/...), which
                        skopeo, podman, buildah, containerd and `docker load` (25+) read;
  <out>/<name>.tar      the same layout as one tar, plus the manifest.json that older `docker load`
                        and `kind load image-archive` / `k3s ctr images import` look for.

Standard library only: it runs with the build machine's python3, outside any virtualenv.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_SPDX = "application/spdx+json"
MEDIA_EMPTY = "application/vnd.oci.empty.v1+json"

# Kept as empty folders: the runtime mounts its own /dev, /proc, /sys and /run.
EMPTIED = ("dev", "proc", "sys", "run")


@dataclass
class ImageConfig:
    """What the image runs: the OCI image config's `config` object, plus its creation time."""

    created: int
    user: str
    entrypoint: list[str]
    cmd: list[str]
    env: list[str]
    labels: dict[str, str]
    workdir: str = "/"
    history: list[str] = field(default_factory=list)


def _json(doc: Any) -> bytes:
    # One canonical encoding: the same document always hashes the same.
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _rfc3339(epoch: int) -> str:
    import datetime as dt  # noqa: PLC0415  (used once)

    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Blobs:
    """The layout's content-addressed store."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)

    def put(self, data: bytes, media_type: str, **extra: Any) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        path = self.root / "blobs" / "sha256" / digest
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data), **extra}

    def path(self, descriptor: dict[str, Any]) -> Path:
        return self.root / "blobs" / "sha256" / descriptor["digest"].removeprefix("sha256:")


def _entries(rootfs: Path) -> list[Path]:
    """Every path under rootfs, parents before children, siblings in byte order of their names."""
    out: list[Path] = []

    def walk(folder: Path) -> None:
        for name in sorted(os.listdir(folder), key=os.fsencode):
            path = folder / name
            out.append(path)
            rel = path.relative_to(rootfs)
            if path.is_dir() and not path.is_symlink() and str(rel) not in EMPTIED:
                walk(path)

    walk(rootfs)
    return out


def layer_tar(rootfs: Path, epoch: int) -> bytes:
    """The uncompressed layer: deterministic for the same folder contents and epoch."""
    buf = io.BytesIO()
    seen: dict[tuple[int, int], str] = {}  # (device, inode) -> first name: hard links
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _entries(rootfs):
            rel = path.relative_to(rootfs).as_posix()
            st = path.lstat()
            info = tarfile.TarInfo(rel)
            info.mode = stat.S_IMODE(st.st_mode)
            info.uid, info.gid = st.st_uid, st.st_gid
            info.uname = info.gname = ""
            info.mtime = epoch
            data: bytes | None = None
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
            elif stat.S_ISLNK(st.st_mode):
                info.type = tarfile.SYMTYPE
                info.linkname = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and key in seen:
                    info.type = tarfile.LNKTYPE
                    info.linkname = seen[key]
                else:
                    seen[key] = rel
                    data = path.read_bytes()
                    info.size = len(data)
            else:
                # Device nodes, fifos, sockets: a container's /dev comes from its runtime.
                raise ValueError(f"{rel}: not a file, folder or link (mode {st.st_mode:o})")
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _gzip(data: bytes) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6, mtime=0, filename="") as gz:
        gz.write(data)
    return out.getvalue()


def write_layout(
    rootfs: Path, out: Path, cfg: ImageConfig, ref: str, name: str, sbom: bytes | None = None
) -> dict[str, Any]:
    """Write the OCI layout under out/oci; returns the image manifest's descriptor."""
    layout = out / "oci"
    blobs = Blobs(layout)
    raw = layer_tar(rootfs, cfg.created)
    diff_id = "sha256:" + hashlib.sha256(raw).hexdigest()
    layer = blobs.put(_gzip(raw), MEDIA_LAYER)
    created = _rfc3339(cfg.created)
    config_doc = {
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": cfg.user,
            "Env": cfg.env,
            "Entrypoint": cfg.entrypoint,
            "Cmd": cfg.cmd,
            "WorkingDir": cfg.workdir,
            "Labels": cfg.labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": line} for line in cfg.history],
    }
    config = blobs.put(_json(config_doc), MEDIA_CONFIG)
    manifest_doc = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config,
        "layers": [layer],
        "annotations": {k: v for k, v in cfg.labels.items() if k.startswith("org.opencontainers.")},
    }
    manifest = blobs.put(
        _json(manifest_doc),
        MEDIA_MANIFEST,
        annotations={"org.opencontainers.image.ref.name": ref, "io.containerd.image.name": name},
    )
    manifests = [manifest]
    if sbom is not None:
        # The SBOM as an OCI 1.1 artifact that refers to the image (`subject`), for registries
        # and tools that look for referrers; the same document is also inside the image.
        empty = blobs.put(b"{}", MEDIA_EMPTY)
        sbom_blob = blobs.put(
            sbom, MEDIA_SPDX, annotations={"org.opencontainers.image.title": "sbom.spdx.json"}
        )
        subject = {k: manifest[k] for k in ("mediaType", "digest", "size")}
        artifact = {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "artifactType": MEDIA_SPDX,
            "config": empty,
            "layers": [sbom_blob],
            "subject": subject,
            "annotations": {"org.opencontainers.image.created": created},
        }
        manifests.append(blobs.put(_json(artifact), MEDIA_MANIFEST, artifactType=MEDIA_SPDX))
    index = {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": manifests}
    (layout / "oci-layout").write_bytes(_json({"imageLayoutVersion": "1.0.0"}))
    (layout / "index.json").write_bytes(_json(index))
    # The docker-archive view of the same blobs (`docker load` before 25, kind, k3s).
    docker_manifest = [
        {
            "Config": f"blobs/sha256/{config['digest'].removeprefix('sha256:')}",
            "RepoTags": [name],
            "Layers": [f"blobs/sha256/{layer['digest'].removeprefix('sha256:')}"],
        }
    ]
    _archive(
        layout, out / f"{name.rsplit('/', 1)[-1].replace(':', '-')}.tar", _json(docker_manifest), cfg.created
    )
    return manifest


def _archive(layout: Path, target: Path, docker_manifest: bytes, epoch: int) -> None:
    """One tar of the layout (sorted, fixed times) plus manifest.json."""
    files: dict[str, bytes] = {"manifest.json": docker_manifest}
    index = json.loads((layout / "index.json").read_bytes())
    wanted = {d["digest"] for d in index["manifests"]}
    for desc in index["manifests"]:
        doc = json.loads((layout / "blobs" / "sha256" / desc["digest"][7:]).read_bytes())
        wanted.add(doc["config"]["digest"])
        wanted.update(layer["digest"] for layer in doc["layers"])
    for digest in wanted:
        files[f"blobs/sha256/{digest[7:]}"] = (layout / "blobs" / "sha256" / digest[7:]).read_bytes()
    files["index.json"] = (layout / "index.json").read_bytes()
    files["oci-layout"] = (layout / "oci-layout").read_bytes()
    tmp = target.with_suffix(".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, epoch
            tar.addfile(info)
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, epoch
            tar.addfile(info, io.BytesIO(files[name]))
    tmp.replace(target)


def prune(layout: Path) -> None:
    """Drop blobs no manifest of index.json reaches (left from earlier builds in the same folder)."""
    index = json.loads((layout / "index.json").read_bytes())
    keep = set()
    for desc in index["manifests"]:
        keep.add(desc["digest"][7:])
        doc = json.loads((layout / "blobs" / "sha256" / desc["digest"][7:]).read_bytes())
        keep.add(doc["config"]["digest"][7:])
        keep.update(layer["digest"][7:] for layer in doc["layers"])
    for blob in (layout / "blobs" / "sha256").iterdir():
        if blob.name not in keep:
            blob.unlink()
