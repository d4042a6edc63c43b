"""A misconfiguration is an error, not a quiet outage (issue 24): each mistake below stops
``nodegate serve --config FILE`` with exit 2 and one line that names what is wrong, and leaves
``state_dir`` as it found it (no CA, session.key, database or store.id from a failed start)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bootstrap.cli.main import main as cli_main
from bootstrap.config import load_settings
from bootstrap.service import preflight
from bootstrap.service.join import ekroots
from bootstrap.service.serve import start
from tests.support.service import EkCa, settings_for
from tests.support.shared_data import shared

Setup = Callable[[Path, dict[str, Any]], str]  # edits the config doc; returns the text to expect


@pytest.fixture(scope="module")
def ek_ca() -> EkCa:
    return EkCa.create()


def _pair(tmp: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    c, k = tmp / f"{name}.pem", tmp / f"{name}.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return c, k


def set_(key: str, value: Any, expect: str) -> Setup:
    def setup(_tmp: Path, doc: dict[str, Any]) -> str:
        section, _, sub = key.partition(".")
        if sub:
            doc.setdefault(section, {})[sub] = value
        else:
            doc[key] = value
        return expect

    return setup


def missing_ek_root(tmp: Path, doc: dict[str, Any]) -> str:
    doc["ek_roots"].append(str(tmp / "roots" / "intel.pem"))
    return f"ek_roots: {tmp / 'roots' / 'intel.pem'} does not exist"


def empty_ek_folder(tmp: Path, doc: dict[str, Any]) -> str:
    (tmp / "empty").mkdir()
    (tmp / "empty" / "README").write_text("put the vendor CAs here\n")
    doc["ek_roots"] = [str(tmp / "empty")]
    return f"ek_roots: the folder {tmp / 'empty'} yields no trust anchor; 1 files skipped"


def empty_ek_store(tmp: Path, doc: dict[str, Any]) -> str:
    store = tmp / "store"
    store.mkdir()
    (store / ekroots.MANIFEST).write_text(json.dumps({"format": ekroots.MANIFEST_FORMAT, "files": []}))
    doc["ek_roots"] = [str(store)]
    return f"ek_roots: the root store {store} yields no trust anchor"


def vendors_not_installed(tmp: Path, doc: dict[str, Any]) -> str:
    doc["ek_roots"] = ["vendors"]
    return "ek_roots: vendors: yields no trust anchor: no vendor root store installed (looked in"


def unbound_cloud_ca(tmp: Path, doc: dict[str, Any]) -> str:
    folder = shared("ek-roots")
    doc["ek_roots"] = [str(folder.file(n)) for n in folder.names("google/EK-AK-CA-*")]
    return "is a gce cloud vTPM CA, which certifies every VM of that cloud"


def tls_cert_missing(tmp: Path, doc: dict[str, Any]) -> str:
    _, key = _pair(tmp, "server")
    doc["tls"] = {"cert_file": str(tmp / "gone.pem"), "key_file": str(key)}
    return f"tls.cert_file: {tmp / 'gone.pem'} does not exist"


def tls_key_missing(tmp: Path, doc: dict[str, Any]) -> str:
    cert, _ = _pair(tmp, "server")
    doc["tls"] = {"cert_file": str(cert), "key_file": str(tmp / "gone.key")}
    return f"tls.key_file: {tmp / 'gone.key'} does not exist"


def tls_half(tmp: Path, doc: dict[str, Any]) -> str:
    cert, _ = _pair(tmp, "server")
    doc["tls"] = {"cert_file": str(cert)}
    return "tls.cert_file is set but tls.key_file is not"


def tls_mismatch(tmp: Path, doc: dict[str, Any]) -> str:
    cert, _ = _pair(tmp, "one")
    _, key = _pair(tmp, "two")
    doc["tls"] = {"cert_file": str(cert), "key_file": str(key)}
    return f"tls.cert_file {cert} and tls.key_file {key} do not load as a certificate and its key"


def port_in_use(tmp: Path, doc: dict[str, Any]) -> str:
    port = doc["_busy"].getsockname()[1]
    doc["listen"] = f"127.0.0.1:{port}"
    return f"listen 127.0.0.1:{port}: port {port} is already in use"


def foreign_address(tmp: Path, doc: dict[str, Any]) -> str:
    doc["listen"] = "192.0.2.7:0"  # TEST-NET-1: on no host
    return "listen 192.0.2.7:0: 192.0.2.7 is not an address of this host"


def state_dir_is_a_file(tmp: Path, doc: dict[str, Any]) -> str:
    (tmp / "statefile").write_text("")
    doc["state_dir"] = str(tmp / "statefile")
    return f"state_dir: {tmp / 'statefile'} is not a folder"


def kubeconfig_missing(tmp: Path, doc: dict[str, Any]) -> str:
    doc["kubernetes"] = {"kubeconfig": str(tmp / "kube" / "config")}
    return f"kubernetes.kubeconfig: kubeconfig {tmp / 'kube' / 'config'} does not exist"


def kubeconfig_garbage(tmp: Path, doc: dict[str, Any]) -> str:
    (tmp / "kubeconfig").write_text("clusters: [this is: not, a kubeconfig\n")
    doc["kubernetes"] = {"kubeconfig": str(tmp / "kubeconfig")}
    return "kubeconfig"


def policy_file_missing(tmp: Path, doc: dict[str, Any]) -> str:
    doc["admission"]["policy_files"] = [str(tmp / "policies.yaml")]
    return f"admission.policy_files: {tmp / 'policies.yaml'} does not exist"


def rbac_file_missing(tmp: Path, doc: dict[str, Any]) -> str:
    doc["admission"]["rbac_files"] = [str(tmp / "rbac.yaml")]
    return f"admission.rbac_files: {tmp / 'rbac.yaml'} does not exist"


def not_yaml(tmp: Path, doc: dict[str, Any]) -> str:
    doc["_raw"] = "trust_domain: [unclosed\n"
    return "is not valid YAML"


def a_list(tmp: Path, doc: dict[str, Any]) -> str:
    doc["_raw"] = "- trust_domain: fleet.test\n"
    return "the config must be a YAML mapping"


MISTAKES: dict[str, Setup] = {
    "a typo in a key": set_(
        "trust_domian", "fleet.test", "trust_domian: unknown key (did you mean trust_domain?)"
    ),
    "listen without a port": set_("listen", "8443", "listen must be HOST:PORT"),
    "an unknown store": set_("store", "postgres", "store: expected one of 'sqlite' or 'kubernetes'"),
    "a duration in words": set_(
        "svid_ttl", "1 hour", "svid_ttl: '1 hour' is not a duration such as 60s, 1h, 1h30m"
    ),
    "a long session_ttl": set_("session_ttl", "20m", "session_ttl above 10m"),
    "a short allowlist entry": set_("ek_allowlist", ["abc"], "'abc' is not a 64-character hex SHA-256"),
    "an unknown admin permission": set_("admin.spiffe_ids", {"spiffe://a/b": ["delete"]}, "admin.spiffe_ids"),
    "a misspelt taint effect": set_("gate.quarantine_effect", "NoExec", "gate.quarantine_effect"),
    "kubelet API over http": set_("kubernetes.kubelet_api_server", "http://10.0.0.1:6443", "https:// URL"),
    "a bad inventory name": set_("inventory", [{"ek_sha256": "a" * 64, "node_name": "GPU_1"}], "GPU_1"),
    "an ek_roots file that does not exist": missing_ek_root,
    "an ek_roots folder with no certificate": empty_ek_folder,
    "a root store with no anchor": empty_ek_store,
    "the vendor store not installed": vendors_not_installed,
    "a GCE vTPM CA with tofu and no binding": unbound_cloud_ca,
    "a missing TLS certificate": tls_cert_missing,
    "a missing TLS key": tls_key_missing,
    "a TLS certificate without its key": tls_half,
    "a TLS key of another certificate": tls_mismatch,
    "a port in use": port_in_use,
    "an address of another host": foreign_address,
    "state_dir is a file": state_dir_is_a_file,
    "a kubeconfig that does not exist": kubeconfig_missing,
    "a kubeconfig that is not one": kubeconfig_garbage,
    "a PackagePolicy file that does not exist": policy_file_missing,
    "an RBAC file that does not exist": rbac_file_missing,
    "a config that is not YAML": not_yaml,
    "a config that is a list": a_list,
}


@pytest.fixture
def busy() -> Iterator[socket.socket]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    yield s
    s.close()


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_each_mistake_is_one_line_and_exit_2(
    mistake: str,
    tmp_path: Path,
    ek_ca: EkCa,
    busy: socket.socket,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ekroots.STORE_ENV, str(tmp_path / "no-store-here"))
    state = tmp_path / "state"
    doc: dict[str, Any] = {
        "trust_domain": "fleet.test",
        "listen": "127.0.0.1:0",
        "state_dir": str(state),
        "ek_roots": [str(ek_ca.write(tmp_path / "ek-root.pem"))],
        "admission": {"listen": "127.0.0.1:0"},  # never the fixed 9443 another process may hold
        "_busy": busy,
    }
    expect = MISTAKES[mistake](tmp_path, doc)
    del doc["_busy"]
    config = tmp_path / "nodegate.yaml"
    config.write_text(doc.pop("_raw") if "_raw" in doc else yaml.safe_dump(doc))
    capsys.readouterr()
    code = cli_main(["serve", "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("nodegate serve: "), err
    assert expect in lines[0], err
    assert not state.exists() or _tree(state) == [], _tree(state)  # nothing left behind


def test_insecure_plaintext_beyond_loopback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"listen: 0.0.0.0:0\nstate_dir: {tmp_path / 's'}\n")
    assert cli_main(["serve", "--config", str(config), "--insecure-plaintext"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "nodegate serve: --insecure-plaintext only binds loopback; listen is 0.0.0.0:0"
    assert not (tmp_path / "s").exists()


def test_the_table_is_long_enough() -> None:
    assert len(MISTAKES) + 1 >= 20


# -- nothing left behind when a start fails after the checks ------------------------------------


async def _serve(config: Path) -> int:
    return await asyncio.to_thread(cli_main, ["serve", "--config", str(config)])


def _config(tmp: Path, ek_ca: EkCa, state: Path, **extra: Any) -> Path:
    config = tmp / "nodegate.yaml"
    doc = {
        "trust_domain": "fleet.test",
        "listen": "127.0.0.1:0",
        "state_dir": str(state),
        "ek_roots": [str(ek_ca.write(tmp / "ek-root.pem"))],
        "admission": {"listen": "127.0.0.1:0"},
        **extra,
    }
    config.write_text(yaml.safe_dump(doc))
    return config


def _unreachable_cluster(tmp: Path, ek_ca: EkCa, state: Path, busy: socket.socket) -> Path:
    """Passes every check, then fails after state_dir was made: the kubernetes store's API does
    not answer (a port that accepts nothing)."""
    port = busy.getsockname()[1]
    busy.close()  # nothing listens there now: connections are refused at once
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return _config(
        tmp, ek_ca, state, store="kubernetes", kubernetes={"kubeconfig": str(kubeconfig), "timeout": "2s"}
    )


async def test_a_late_failure_leaves_no_state_dir(
    tmp_path: Path, ek_ca: EkCa, busy: socket.socket, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    assert await _serve(_unreachable_cluster(tmp_path, ek_ca, state, busy)) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("nodegate serve:")]
    assert len(lines) == 1, err
    assert "store" in lines[0], err
    assert "Traceback" not in err
    assert not state.exists()


async def test_a_late_failure_leaves_an_empty_state_dir_empty(
    tmp_path: Path, ek_ca: EkCa, busy: socket.socket
) -> None:
    state = tmp_path / "state"
    (state / "ca").mkdir(parents=True)
    assert await _serve(_unreachable_cluster(tmp_path, ek_ca, state, busy)) == 2
    assert _tree(state) == ["ca"]


async def test_a_late_failure_takes_back_a_new_ca_and_keeps_what_was_there(
    tmp_path: Path, ek_ca: EkCa, capsys: pytest.CaptureFixture[str]
) -> None:
    """A started service, then its CA removed and its session key damaged: the next start makes a
    new CA (the store holds no node), then fails on the session key. The new CA is taken back;
    every file that was there stays as it was."""
    state = tmp_path / "state"
    config = _config(tmp_path, ek_ca, state)
    s = await start(load_settings(config), kube=False)
    await s.close()
    shutil.rmtree(state / "ca")
    (state / "session.key").write_text("not a key\n")
    before = {p: (state / p).read_bytes() for p in _tree(state) if (state / p).is_file()}
    capsys.readouterr()
    assert await _serve(config) == 2
    err = capsys.readouterr().err
    assert "session.key" in err, err
    assert not (state / "ca").exists()  # the CA this failed start made is gone
    after = {p: (state / p).read_bytes() for p in _tree(state) if (state / p).is_file()}
    assert after.keys() <= before.keys()
    assert {p: after[p] for p in after if not p.startswith("nodegate.db")} == {
        p: before[p] for p in after if not p.startswith("nodegate.db")
    }


def test_a_certificate_for_localhost_only_on_a_wide_listener_is_a_warning(
    tmp_path: Path, ek_ca: EkCa
) -> None:
    settings = settings_for(tmp_path, ek_ca, listen="0.0.0.0:0", server_names=["localhost", "127.0.0.1"])
    found = preflight.warnings(settings, insecure_plaintext=False)
    assert any("name only this host's loopback, but listen is 0.0.0.0:0" in w for w in found), found
    assert (
        preflight.warnings(
            settings_for(tmp_path, ek_ca, server_names=["localhost"]), insecure_plaintext=False
        )
        == []
    )
    wide = settings_for(tmp_path, ek_ca, listen="0.0.0.0:0", server_names=["gate.fleet.test"])
    assert preflight.warnings(wide, insecure_plaintext=False) == []
