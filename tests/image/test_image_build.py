"""`make image`: reproducible, the Dockerfile's layout and settings, an SBOM of what is inside."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import tarfile

from tests.image.runtime import ROOT, Built, Podman, build, input_key, lockfile, require_root_and_tools

DOCKERFILE = ROOT / "Dockerfile"


def final_stage() -> list[tuple[str, str]]:
    """The Dockerfile's last stage as (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[list[tuple[str, str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            stages.append([])
        stages[-1].append((word.upper(), rest.strip()))
    return stages[-1]


def dockerfile_intent() -> dict[str, object]:
    stage = final_stage()
    env: dict[str, str] = {}
    labels: dict[str, str] = {}
    out: dict[str, object] = {"env": env, "labels": labels, "copies": [], "debs": []}
    for word, rest in stage:
        if word == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
        elif word == "LABEL":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                labels[key] = value
        elif word in ("ENTRYPOINT", "CMD"):
            out[word] = json.loads(rest)
        elif word == "USER":
            out[word] = rest
        elif word == "COPY":
            *_, dst = rest.split()
            out["copies"].append(dst)  # type: ignore[attr-defined]
        elif word == "RUN" and "apt-get install" in rest:
            words = rest.split("apt-get install", 1)[1].split("&&")[0].split()
            out["debs"] = [w for w in words if not w.startswith("-")]
    return out


def test_the_same_inputs_give_the_same_image_digest(built_image: Built) -> None:
    stamp = (built_image.out / "inputs.sha256").read_text()
    assert input_key() == stamp, "the image's inputs changed during this session: run again"
    first_archive = hashlib.sha256(built_image.archive.read_bytes()).hexdigest()
    again = build(built_image.out)
    assert again.digest == built_image.digest
    assert hashlib.sha256(again.archive.read_bytes()).hexdigest() == first_archive


def test_config_matches_the_dockerfile(built_image: Built) -> None:
    intent = dockerfile_intent()
    config = built_image.config()["config"]
    assert isinstance(config, dict)
    assert config["User"] == intent["USER"] == "65532:65532"
    assert config["Entrypoint"] == intent["ENTRYPOINT"] == ["nodegate"]
    assert config["Cmd"] == intent["CMD"]
    env = dict(item.split("=", 1) for item in config["Env"])
    wanted_env = intent["env"]
    assert isinstance(wanted_env, dict)
    for key, value in wanted_env.items():
        if key == "PATH":  # the Dockerfile prepends to its base image's PATH
            assert value.startswith("/opt/nodegate/bin:")
            assert env["PATH"].split(":")[0] == "/opt/nodegate/bin"
        else:
            assert env[key] == value
    labels = intent["labels"]
    assert isinstance(labels, dict)
    assert labels, "the Dockerfile declares the OCI labels make image sets"
    assert set(labels) <= set(config["Labels"])
    assert config["Labels"]["org.opencontainers.image.version"] == built_image.info["name"].split(":")[-1]  # type: ignore[union-attr]
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", config["Labels"]["org.opencontainers.image.revision"])


def test_file_system_layout_matches_the_dockerfile(built_image: Built) -> None:
    """What the Dockerfile puts where: the venv it copies, its entry points, the Debian packages."""
    intent = dockerfile_intent()
    root = built_image.rootfs
    assert "/opt/nodegate" in intent["copies"]  # type: ignore[operator]
    venv = root / "opt" / "nodegate"
    assert (venv / "pyvenv.cfg").is_file()
    for script in ("nodegate", "kubectl-nodegate", "python3"):
        assert (venv / "bin" / script).exists(), script
    shebang = (venv / "bin" / "nodegate").read_text().splitlines()[0]
    assert shebang == "#!/opt/nodegate/bin/python3"
    site = next(venv.glob("lib/python3*/site-packages"))
    for package in ("attest", "admission", "bootstrap"):
        assert (site / package / "__init__.py").is_file(), package
    status = (root / "var/lib/dpkg/status").read_text()
    installed = set(re.findall(r"^Package: (\S+)\nStatus: install ok installed", status, re.M))
    missing = set(intent["debs"]) - installed  # type: ignore[arg-type]
    assert not missing, f"the Dockerfile installs {sorted(missing)}, make image does not"
    assert (root / "usr/bin/python3").exists()
    # the vendor EK roots from ruby-tpm-key-attestation's .deb, in both builds (test_image_ekroots.py)
    assert "/usr/share/nodegate" in intent["copies"]  # type: ignore[operator]
    assert (root / "usr/share/nodegate/ek-roots/Nuvoton/RootCA/Nuvoton TPM Root CA 2111.cer").is_file()


def test_no_package_manager_caches_logs_or_timestamped_bytecode(built_image: Built) -> None:
    root = built_image.rootfs
    assert not (root / "var/lib/apt/lists").exists()
    assert not (root / "var/cache/apt").exists()
    assert [p for p in (root / "var/log").rglob("*") if p.is_file()] == []
    assert not (root / "var/cache/ldconfig/aux-cache").exists()
    pycs = list((root / "opt/nodegate").rglob("*.pyc")) + list((root / "usr/lib/python3.11").rglob("*.pyc"))
    assert len(pycs) > 1000
    # PEP 552 flags word: 0b01 is "hash-based, not checked" (no source mtime inside).
    flags = {int.from_bytes(p.read_bytes()[4:8], "little") for p in pycs}
    assert flags == {1}


def test_sbom_lists_the_debian_and_python_packages_inside(built_image: Built) -> None:
    inside = built_image.rootfs / "usr/share/doc/nodegate/sbom.spdx.json"
    doc = json.loads(inside.read_bytes())
    assert doc["spdxVersion"] == "SPDX-2.3"
    purls = {r["referenceLocator"] for p in doc["packages"] for r in p["externalRefs"]}
    names = {p["name"] for p in doc["packages"]}
    assert {"python3.11-minimal", "libtss2-esys-3.0.2-0", "ca-certificates", "libc6"} <= names
    assert {"nodegate", "tpm2-pytss", "aiohttp", "cryptography"} <= names
    assert any(p.startswith("pkg:deb/debian/libc6@") for p in purls)
    assert any(p.startswith("pkg:pypi/tpm2-pytss@3.") for p in purls)
    # every Python package at the version uv.lock pins (issue 40), and all of the runtime set there
    locked = lockfile.pins(lockfile.export("runtime", hashes=False))
    pypi = dict(re.findall(r"pkg:pypi/([^@]+)@(\S+)", " ".join(sorted(purls))))
    assert pypi.pop("nodegate") == built_image.info["name"].split(":")[-1]
    assert {lockfile.normalise(n): v for n, v in pypi.items()} == locked
    status = (built_image.rootfs / "var/lib/dpkg/status").read_text()
    # every dpkg-installed package, and ruby-tpm-key-attestation, whose EK roots the image carries
    # unpacked (not installed: no Ruby)
    debs = sum(1 for p in purls if p.startswith("pkg:deb/"))
    assert debs == status.count("Status: install ok installed") + 1
    assert any(p.startswith("pkg:deb/debian/ruby-tpm-key-attestation@0.11.0-1") for p in purls)
    # ... and the same document as an OCI artifact that refers to the image.
    index = json.loads((built_image.layout / "index.json").read_bytes())
    (artifact,) = [m for m in index["manifests"] if m.get("artifactType") == "application/spdx+json"]
    manifest = json.loads(built_image.blob(artifact["digest"]))
    assert manifest["subject"]["digest"] == built_image.digest
    assert built_image.blob(manifest["layers"][0]["digest"]) == inside.read_bytes()


def test_skopeo_reads_the_layout(built_image: Built) -> None:
    require_root_and_tools("skopeo")
    tag = str(built_image.info["name"]).split(":")[-1]
    out = subprocess.run(
        ["skopeo", "inspect", f"oci:{built_image.layout}:{tag}"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["Digest"] == built_image.digest


def test_docker_archive_names_the_charts_default_image(built_image: Built) -> None:
    with tarfile.open(built_image.archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        (entry,) = json.loads(member.read())
    values = (ROOT / "charts/nodegate/values.yaml").read_text()
    repository = re.search(r"^  repository: (\S+)", values, re.M)
    app_version = re.search(
        r'^appVersion: "?([^"\n]+)"?', (ROOT / "charts/nodegate/Chart.yaml").read_text(), re.M
    )
    assert repository
    assert app_version
    assert entry["RepoTags"] == [f"{repository.group(1)}:{app_version.group(1)}"]


def test_the_image_carries_nodegates_wheel_for_nodes(built_image: Built) -> None:
    """docs/node-join.md: nodes `podman cp` the wheel out of the image (issue 34, item 2)."""
    (wheel,) = (built_image.rootfs / "opt" / "nodegate" / "wheels").glob("nodegate-*-py3-none-any.whl")
    assert wheel.name == f"nodegate-{built_image.info['name'].split(':')[-1]}-py3-none-any.whl"  # type: ignore[union-attr]


def test_build_json_names_the_image_id_podman_shows(built_image: Built, podman: Podman) -> None:
    """The tar's manifest digest does not survive `podman load`; the image ID (config digest) does,
    and docs/operations.md tells operators to compare that."""
    shown = podman.call("images", "--no-trunc", "--format", "{{.ID}}", str(built_image.info["name"]))
    assert shown.returncode == 0, shown.stderr
    assert f"sha256:{shown.stdout.strip().removeprefix('sha256:')}" == built_image.info["image_id"]
