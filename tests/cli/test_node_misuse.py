"""The node commands stop at once, with one line and a non-zero exit, on what cannot work: a
named event log that cannot be sent (measured boot would refuse the node later, pointing
elsewhere), plain http://, and a server certificate that does not name the host
(the line says which names it has and which setting to change)."""

from __future__ import annotations

import datetime as dt
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from attest import svid
from bootstrap.cli import node
from bootstrap.cli.main import main as cli_main
from bootstrap.names import is_node_name
from bootstrap.node.client import ServiceClient, http_session, tls_context
from bootstrap.node.errors import JoinFailed
from bootstrap.protocol import StartResponse
from bootstrap.service.serve import start
from tests.support.service import EkCa, settings_for

_COMMON = ("--server", "https://127.0.0.1:1", "--ca-bundle", "bundle.pem")


def _no_network(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    called: list[Any] = []

    async def fake(opts: Any) -> Any:
        called.append(opts)
        raise AssertionError("must stop before the TPM and the server")

    for name in ("join", "renew", "attest"):
        monkeypatch.setattr(node, name, fake)
    return called


def _log(tmp: Path, kind: str) -> tuple[Path, str]:
    path = tmp / "binary_bios_measurements"
    if kind == "missing":
        return path, f"--event-log {path} does not exist"
    if kind == "empty":
        path.write_bytes(b"")
        return path, "is empty"
    if kind == "folder":
        path.mkdir()
        return path, "cannot be read"
    path.write_bytes(b"\0" * (2 * 1024 * 1024))
    return path, "is larger than"


@pytest.mark.parametrize("kind", ["missing", "empty", "folder", "huge"])
@pytest.mark.parametrize("command", ["join", "renew", "attest"])
def test_a_named_event_log_that_cannot_be_sent_stops_the_command(
    command: str,
    kind: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    called = _no_network(monkeypatch)
    path, needle = _log(tmp_path, kind)
    extra = ["--node-name", "gpu-1"] if command == "join" else []
    code = cli_main([command, *_COMMON, *extra, "--event-log", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    assert called == []
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err, err


def test_an_unreadable_event_log_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    _no_network(monkeypatch)
    path = tmp_path / "log"
    path.write_bytes(b"x")
    path.chmod(0)
    assert cli_main(["join", *_COMMON, "--node-name", "gpu-1", "--event-log", str(path)]) == 2
    assert "run as root" in capsys.readouterr().err


def test_plain_http_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    called = _no_network(monkeypatch)
    code = cli_main(["join", "--server", "http://10.0.0.5:8443", "--ca-bundle", "b.pem", "--node-name", "n"])
    err = capsys.readouterr().err
    assert code == 2
    assert called == []
    assert err.strip() == ("nodegate join: --server must be https://host[:port], not 'http://10.0.0.5:8443'")


async def test_a_certificate_without_the_dialled_name_says_which_names_it_has(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, EkCa.create(), server_names=["gate.fleet.test", "10.9.8.7"])
    serving = await start(settings, kube=False)
    try:
        bundle = tmp_path / "bundle.pem"
        bundle.write_bytes(svid.bundle_pem(serving.service.cas.roots(dt.datetime.now(dt.UTC))))
        base = f"https://127.0.0.1:{serving.port}"
        async with http_session(tls_context(bundle), 10.0, "test") as session:
            with pytest.raises(JoinFailed) as info:
                await ServiceClient(session, base, bundle).post("/v1/join/start", {}, StartResponse)
    finally:
        await serving.close()
    assert info.value.code == "tls_untrusted"
    text = str(info.value)
    assert "does not name 127.0.0.1; it names gate.fleet.test, 10.9.8.7" in text
    assert "add 127.0.0.1 to server_names" in text


async def test_self_issued_names_default_to_the_hosts_and_follow_the_config(tmp_path: Path) -> None:
    """No server_names: the certificate names loopback and this host; a changed server_names
    is issued at the next start instead of waiting for the old certificate to expire."""
    ek_ca = EkCa.create()
    settings = settings_for(tmp_path, ek_ca, server_names=[])
    serving = await start(settings, kube=False)
    await serving.close()
    cert_file = settings.state_dir / "tls" / "server.pem"
    san = x509.load_pem_x509_certificate(cert_file.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    dns = san.value.get_values_for_type(x509.DNSName)
    ips = [str(i) for i in san.value.get_values_for_type(x509.IPAddress)]
    assert "localhost" in dns
    assert "127.0.0.1" in ips
    if is_node_name(socket.gethostname().lower()):
        assert socket.gethostname().lower() in dns
    settings2 = settings_for(tmp_path, ek_ca, server_names=["gate.fleet.test"])
    serving = await start(settings2, kube=False)
    await serving.close()
    san = x509.load_pem_x509_certificate(cert_file.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert san.value.get_values_for_type(x509.DNSName) == ["gate.fleet.test"]
