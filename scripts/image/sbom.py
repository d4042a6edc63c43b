"""An SPDX 2.3 JSON SBOM of an image's root file system: its Debian packages (dpkg's status file)
and the Python distributions in its virtualenv (their .dist-info METADATA). Deterministic: no
clock, no random ids (the document namespace is derived from the package list itself)."""

from __future__ import annotations

import email.parser
import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

_REF_SAFE = re.compile(r"[^A-Za-z0-9.\-]")


def dpkg_packages(rootfs: Path) -> list[dict[str, str]]:
    """Installed packages from var/lib/dpkg/status, sorted by name."""
    text = (rootfs / "var/lib/dpkg/status").read_text(encoding="utf-8")
    out = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue  # continuation lines (descriptions, conffiles)
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        if fields.get("Status", "").endswith(" installed"):
            source = fields.get("Source", fields["Package"]).split(" ", 1)[0]
            out.append(
                {
                    "name": fields["Package"],
                    "version": fields["Version"],
                    "arch": fields.get("Architecture", ""),
                    "source": source,
                }
            )
    return sorted(out, key=lambda p: p["name"])


def python_packages(site_packages: Path) -> list[dict[str, str]]:
    """Installed distributions (name, version, licence as declared), sorted by name."""
    out = []
    for meta in sorted(site_packages.glob("*.dist-info/METADATA")):
        msg = email.parser.HeaderParser().parsestr(meta.read_text(encoding="utf-8", errors="replace"))
        licence = msg.get("License-Expression") or ""
        out.append({"name": str(msg["Name"]), "version": str(msg["Version"]), "license": str(licence)})
    return sorted(out, key=lambda p: p["name"].lower())


def spdx(
    rootfs: Path,
    site_packages: Path,
    image_name: str,
    created: str,
    extra_debs: Sequence[dict[str, str]] = (),
) -> dict[str, Any]:
    """``extra_debs``: Debian packages whose files the image carries without dpkg installing them
    (the vendor EK roots of ruby-tpm-key-attestation)."""
    debs = sorted([*dpkg_packages(rootfs), *extra_debs], key=lambda p: p["name"])
    pys = python_packages(site_packages)
    packages: list[dict[str, Any]] = []
    for d in debs:
        purl = f"pkg:deb/debian/{quote(d['name'])}@{quote(d['version'])}?arch={d['arch']}&distro=debian-12"
        packages.append(
            {
                "SPDXID": "SPDXRef-deb-" + _REF_SAFE.sub("-", f"{d['name']}-{d['version']}"),
                "name": d["name"],
                "versionInfo": d["version"],
                "supplier": "Organization: Debian",
                "downloadLocation": "NOASSERTION",
                "licenseConcluded": "NOASSERTION",
                "licenseDeclared": "NOASSERTION",
                "copyrightText": "NOASSERTION",
                "filesAnalyzed": False,
                "sourceInfo": f"Debian source package {d['source']}",
                "externalRefs": [
                    {
                        "referenceCategory": "PACKAGE-MANAGER",
                        "referenceType": "purl",
                        "referenceLocator": purl,
                    }
                ],
            }
        )
    for p in pys:
        purl = f"pkg:pypi/{quote(p['name'].lower().replace('_', '-'))}@{quote(p['version'])}"
        packages.append(
            {
                "SPDXID": "SPDXRef-pypi-" + _REF_SAFE.sub("-", f"{p['name']}-{p['version']}"),
                "name": p["name"],
                "versionInfo": p["version"],
                "downloadLocation": "NOASSERTION",
                "licenseConcluded": "NOASSERTION",
                "licenseDeclared": p["license"] or "NOASSERTION",
                "copyrightText": "NOASSERTION",
                "filesAnalyzed": False,
                "externalRefs": [
                    {
                        "referenceCategory": "PACKAGE-MANAGER",
                        "referenceType": "purl",
                        "referenceLocator": purl,
                    }
                ],
            }
        )
    listing = json.dumps([debs, pys], sort_keys=True).encode()
    namespace = f"https://spdx.org/spdxdocs/nodegate-image-{hashlib.sha256(listing).hexdigest()[:32]}"
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": image_name,
        "documentNamespace": namespace,
        "creationInfo": {"created": created, "creators": ["Tool: nodegate scripts/image/build.py"]},
        "documentDescribes": [p["SPDXID"] for p in packages],
        "packages": packages,
    }


def dump(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode()
