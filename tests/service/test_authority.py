"""The CA on disk: created once even by racing replicas, rotated with overlap, and the service's
TLS certificate reissued when its signer changes."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import pytest
from cryptography import x509

from attest import svid
from bootstrap.service.pki.authority import CaStore, CaUnavailable, server_certificate

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
    assert first.refresh_at == first.certificate.not_valid_after_utc - dt.timedelta(days=10)
    rotated = store.rotate(NOW, dt.timedelta(hours=1))
    old, new = rotated.authorities[0], rotated.signer
    # TLS stays on the old root while it is in the bundle (nodes with older bundles can still
    # reach the service to fetch the new one), but no longer than that root stays published.
    kept = server_certificate(tmp_path / "tls", rotated, names, NOW)
    assert kept.certificate.issuer == old.certificate.subject
    assert kept.certificate != first.certificate  # reissued: the old one outlived the retirement
    assert old.retire_at is not None
    assert kept.certificate.not_valid_after_utc <= old.retire_at
    margin = old.retire_at - dt.timedelta(minutes=30)
    assert margin - dt.timedelta(seconds=1) <= kept.refresh_at <= margin  # certificates hold whole seconds
    assert server_certificate(tmp_path / "tls", rotated, names, NOW).certificate == kept.certificate
    # Half an hour before the old root retires, the new signer takes over.
    later = kept.refresh_at + dt.timedelta(seconds=1)
    second = server_certificate(tmp_path / "tls", rotated, names, later)
    assert second.certificate.issuer == new.certificate.subject
    svid.verify_svid(
        second.certificate, roots=rotated.roots(later), trust_domain="fleet.test", now=later, usage="server"
    )
    (tmp_path / "tls" / "server.key").write_text("torn")  # a crash between key and cert writes
    third = server_certificate(tmp_path / "tls", rotated, names, later)
    assert third.certificate != second.certificate
    assert (tmp_path / "tls" / "server.key").stat().st_mode & 0o777 == 0o600
