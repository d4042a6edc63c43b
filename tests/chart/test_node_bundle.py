"""The bundle docs/node-join.md tells a node to trust is the one that validates the chart's serving
certificate (issue 34, item 3): the documented ``kubectl ... get secret ... ca.crt`` names a Secret
and key the chart renders, a TLS handshake with the node's own TLS settings
(``bootstrap.node.client.tls_context``) against the rendered certificate succeeds for the host in
the docs' ``--server``, every unit reads the bundle from the path the cloud-init example writes,
and nodegate's SVID trust bundle (``/v1/bundle``) does not validate the chart's certificate."""

from __future__ import annotations

import base64
import datetime as dt
import re
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from attest import ca, svid
from bootstrap.node.client import tls_context
from tests.chart.test_chart import helm_path, one, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "node-join.md"
BUNDLE = "/etc/nodegate/bundle.pem"


def _doc() -> str:
    return DOC.read_text()


def _documented_command() -> tuple[str, str, str]:
    """(namespace, secret, key) of the documented command that writes the bundle."""
    m = re.search(
        r"kubectl -n (\S+) get secret (\S+) -o jsonpath='\{\.data\.([a-z]+)\\\.([a-z]+)\}' \| base64 -d",
        _doc(),
    )
    assert m, "node-join.md shows how to get the bundle from the chart"
    return m.group(1), m.group(2), f"{m.group(3)}.{m.group(4)}"


def _cloud_init() -> dict[str, Any]:
    (block,) = [
        b for b in re.findall(r"```yaml\n(.*?)```", _doc(), re.DOTALL) if b.startswith("#cloud-config")
    ]
    doc: dict[str, Any] = yaml.safe_load(block)
    return doc


def _server_host() -> str:
    files = {f["path"]: f.get("content", "") for f in _cloud_init()["write_files"]}
    (line,) = [x for x in files["/etc/nodegate/join.env"].splitlines() if x.startswith("NODEGATE_SERVER=")]
    host = urlsplit(line.split("=", 1)[1]).hostname
    assert host
    return host


@pytest.fixture(scope="module")
def chart_tls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The rendered TLS Secret, for an install that names the docs' server host (tls.extraDnsNames)."""
    namespace, secret, _ = _documented_command()
    release = secret.removesuffix("-tls")  # "nodegate": the chart's fullname is then the release
    docs = render(
        helm_path(),
        tmp_path_factory.mktemp("bundle"),
        {"tls": {"extraDnsNames": [_server_host()]}},
        namespace=namespace,
        release=release,
    )
    found = one(docs, "Secret", secret)
    assert found["metadata"]["namespace"] == namespace
    return {k: base64.b64decode(v) for k, v in found["data"].items()}


def _handshake(bundle: Path, cert: bytes, key: bytes, host: str, tmp: Path) -> None:
    """A TLS handshake over memory BIOs (no sockets): the node's client context against a server
    presenting ``cert``. Raises ssl.SSLCertVerificationError when the bundle does not validate it."""
    (tmp / "tls.crt").write_bytes(cert)
    (tmp / "tls.key").write_bytes(key)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
    client_ctx = tls_context(bundle)
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=host)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for name, side in (("client", client), ("server", server)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return
    raise AssertionError("the handshake did not finish")


def test_the_documented_bundle_validates_the_chart_certificate(
    chart_tls: dict[str, bytes], tmp_path: Path
) -> None:
    _, _, key = _documented_command()
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(chart_tls[key])  # what `kubectl ... | base64 -d > bundle.pem` writes
    _handshake(bundle, chart_tls["tls.crt"], chart_tls["tls.key"], _server_host(), tmp_path)


def test_the_svid_bundle_does_not_validate_it(chart_tls: dict[str, bytes], tmp_path: Path) -> None:
    """/v1/bundle serves nodegate's own CA: the mistake issue 34 found (tls_untrusted)."""
    cas = ca.initial("fleet.test", now=dt.datetime.now(dt.UTC))
    bundle = tmp_path / "v1-bundle.pem"
    bundle.write_bytes(svid.bundle_pem(cas.roots(dt.datetime.now(dt.UTC))))
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(bundle, chart_tls["tls.crt"], chart_tls["tls.key"], _server_host(), tmp_path)


def test_every_unit_trusts_the_bundle_cloud_init_writes() -> None:
    doc = _cloud_init()
    assert BUNDLE in {f["path"] for f in doc["write_files"]}
    text = _doc().replace("\\\n", " ")
    bundles = set(re.findall(r"--ca-bundle (\S+)", text))
    assert bundles == {BUNDLE}, bundles
