"""The CA on disk: created once even by racing replicas, rotated with overlap, and the service's
TLS certificate reissued when its signer changes."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import pytest
from cryptography import x509

from attest import svid
from bootstrap.authority import CaStore, CaUnavailable, server_certificate

NOW = dt.datetime.now(dt.UTC)


def test_created_once_by_racing_replicas(tmp_path: Path) -> None:
    folder = tmp_path / "ca"
    results: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def start() -> None:
        barrier.wait()
        try:
            results.append(CaStore(folder, "fleet.test").load_or_create(NOW).signer.stem)
        except Exception as exc:  # noqa: BLE001  (collected: in a thread it would only be a warning)
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == 6
    assert len(set(results)) == 1
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [f"{results[0]}.key", f"{results[0]}.pem", "index.json"]
    )
    assert all(p.stat().st_mode & 0o077 == 0 for p in folder.iterdir())


def test_rotation_overlap_and_stamp(tmp_path: Path) -> None:
    store = CaStore(tmp_path / "ca", "fleet.test")
    first = store.load_or_create(NOW)
    stamp = store.stamp()
    rotated = store.rotate(NOW, dt.timedelta(hours=2))
    assert store.stamp() != stamp
    assert [a.stem for a in rotated.authorities] == [first.signer.stem, rotated.signer.stem]
    assert len(store.load().roots(NOW)) == 2
    assert len(store.load().roots(NOW + dt.timedelta(hours=3))) == 1  # the old one retired
    later = store.rotate(NOW + dt.timedelta(hours=3), dt.timedelta(hours=2))  # prunes the retired one
    assert first.signer.stem not in {a.stem for a in later.authorities}
    assert not (tmp_path / "ca" / f"{first.signer.stem}.key").exists()


def test_wrong_trust_domain_and_garbage_refused(tmp_path: Path) -> None:
    CaStore(tmp_path / "ca", "fleet.test").load_or_create(NOW)
    with pytest.raises(CaUnavailable, match="trust domain"):
        CaStore(tmp_path / "ca", "other.test").load()
    (tmp_path / "ca" / "index.json").write_text("{")
    with pytest.raises(CaUnavailable):
        CaStore(tmp_path / "ca", "fleet.test").load()


def test_server_certificate_reissued_after_rotation(tmp_path: Path) -> None:
    store = CaStore(tmp_path / "ca", "fleet.test")
    cas = store.load_or_create(NOW)
    names = ("localhost", "127.0.0.1")
    first = server_certificate(tmp_path / "tls", cas, names, NOW)
    assert server_certificate(tmp_path / "tls", cas, names, NOW).certificate == first.certificate
    san = first.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    svid.verify_svid(
        first.certificate, roots=cas.roots(NOW), trust_domain="fleet.test", now=NOW, usage="server"
    )
    rotated = store.rotate(NOW, dt.timedelta(hours=1))
    second = server_certificate(tmp_path / "tls", rotated, names, NOW)
    assert second.certificate != first.certificate
    assert second.certificate.issuer == rotated.signer.certificate.subject
    (tmp_path / "tls" / "server.key").write_text("torn")  # a crash between key and cert writes
    third = server_certificate(tmp_path / "tls", rotated, names, NOW)
    assert third.certificate != second.certificate
    assert (tmp_path / "tls" / "server.key").stat().st_mode & 0o777 == 0o600
