"""The pin's JWE and calling convention, without a TPM: what Clevis hands it and what it refuses."""

from __future__ import annotations

import functools
import io
import json
import os
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bootstrap.cli import clevispin
from bootstrap.node.disk import jwe, pin

KEY = bytes(range(32))


@functools.cache
def binding() -> jwe.Binding:
    return jwe.Binding(
        url="https://nodegate.example.org:8443",
        ca="-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        node="gpu-1",
        volume="6f1d2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b",
        ek_sha256="ab" * 32,
        epoch=0,
        version=1,
    )


@given(st.binary(max_size=512))
def test_seal_unseal_round_trip_and_the_header_is_authenticated(plain: bytes) -> None:
    sealed = jwe.seal(binding(), KEY, plain)
    assert jwe.unseal(sealed, KEY) == plain
    assert jwe.binding_of(sealed) == binding()
    assert jwe.compact_of(jwe.flattened_of(sealed)) == sealed  # the LUKS token's form and back
    head, *rest = sealed.split(".")
    header = json.loads(jwe._unb64u(head, "h"))
    header["clevis"]["nodegate"]["node"] = "gpu-2"  # pointed at another node
    forged = ".".join([jwe._b64u(json.dumps(header).encode()), *rest])
    with pytest.raises(jwe.JweError, match="does not open"):
        jwe.unseal(forged, KEY)


def test_another_key_does_not_open_it() -> None:
    with pytest.raises(jwe.JweError, match="does not open"):
        jwe.unseal(jwe.seal(binding(), KEY, b"x"), bytes(32))


@pytest.mark.parametrize(
    "text",
    [
        "a.b.c",
        "x" * (jwe.MAX_JWE + 1),
        "eyJhbGciOiJkaXIifQ.a2V5.AAAA.AAAA.AAAA",  # an encrypted key: not alg dir
        "e30..AAAA.AAAA.AAAA",  # {}: no clevis pin
    ],
)
def test_what_is_not_a_nodegate_jwe_is_refused(text: str) -> None:
    with pytest.raises(jwe.JweError):
        jwe.binding_of(text)


def test_another_pins_jwe_is_refused() -> None:
    header = jwe._b64u(json.dumps({"alg": "dir", "enc": "A256GCM", "clevis": {"pin": "tang"}}).encode())
    with pytest.raises(jwe.JweError, match="not nodegate"):
        jwe.binding_of(f"{header}..AAAA.AAAA.AAAA")


@pytest.mark.parametrize(
    ("argv", "device"),
    [
        (["-y", "-k", "pass", "-d", "disk.img", "nodegate", "{}"], "disk.img"),
        (["-ydisk.img"], None),
        (["-f", "-d/dev/sda3", "sss", "{}"], "/dev/sda3"),
        (["-yd", "/dev/nvme0n1p3", "nodegate", "{}"], "/dev/nvme0n1p3"),
        (["-k", "pass", "nodegate", "{}"], None),
    ],
)
def test_the_device_is_read_from_clevis_luks_binds_options(argv: list[str], device: str | None) -> None:
    assert pin._device_option(argv) == device


def test_a_config_is_strict() -> None:
    with pytest.raises(pin.JoinUsageError, match="typo"):
        pin.parse_config('{"url": "https://h:1", "ca_bundle": "/x", "typo": 1}')
    with pytest.raises(pin.JoinUsageError, match="url"):
        pin.parse_config('{"ca_bundle": "/x"}')


def _run(main: Any, argv: list[str], stdin: bytes, monkeypatch: pytest.MonkeyPatch, tty: bool = False) -> int:
    stream = io.TextIOWrapper(io.BytesIO(stdin))
    monkeypatch.setattr(stream, "isatty", lambda: tty)
    monkeypatch.setattr(sys, "stdin", stream)
    return int(main(argv))


def test_the_calling_convention(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for main in (clevispin.encrypt_main, clevispin.decrypt_main):
        assert _run(main, ["--summary"], b"", monkeypatch) == 0
        assert capsys.readouterr().out.strip() == clevispin.SUMMARY
        assert _run(main, ["a", "b", "c"], b"", monkeypatch) == 2  # usage
    assert _run(clevispin.encrypt_main, ["{}"], b"", monkeypatch, tty=True) == 2  # no plaintext on a tty
    assert (
        _run(clevispin.encrypt_main, ['{"url": "x"}', "-y"], b"p", monkeypatch) == 2
    )  # -y is fine, the config not
    assert "ca_bundle" in capsys.readouterr().err
    assert _run(clevispin.decrypt_main, [], b"not a jwe", monkeypatch) == 1
    assert "compact JWE" in capsys.readouterr().err


def test_decrypt_reads_the_machine_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pin.TCTI_ENV, "swtpm:port=1")
    monkeypatch.setenv(pin.EVENT_LOG_ENV, "/tmp/log.bin")
    opts = pin._options(
        binding().url, pin.Path("/x"), "gpu-1", binding().volume, "rsa", "device:/dev/tpm0", 1, 0
    )
    assert (opts.tcti, str(opts.event_log), opts.key_version, opts.epoch) == (
        "swtpm:port=1",
        "/tmp/log.bin",
        1,
        0,
    )
    monkeypatch.delenv(pin.TCTI_ENV)
    assert pin._options(binding().url, pin.Path("/x"), "gpu-1", binding().volume, "rsa", None, 1, 0).tcti == (
        "device:/dev/tpmrm0"
    )
    assert os.environ.get(pin.BOOT_ID_ENV) is None


@pytest.mark.usefixtures("luks_tools")
def test_status_of_a_volume_that_is_still_the_images(
    tmp_path: pin.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bootstrap.cli.main import main as cli_main
    from tests.disk import luksimg

    disk = luksimg.make_volume(tmp_path / "image.img")
    assert cli_main(["disk", "status", str(disk)]) == 0
    text = capsys.readouterr().out
    assert "NOT re-keyed" in text
    assert "no nodegate binding" in text
    assert cli_main(["disk", "status", str(disk), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["uuid"], doc["rekeyed"], doc["bindings"], doc["keyslots"]) == (
        luksimg.uuid_of(disk),
        False,
        [],
        ["0"],
    )
    assert cli_main(["disk", "unlock", str(disk), "--test"]) == 2  # a local problem
    assert "not_bound" in capsys.readouterr().err
    assert cli_main(["disk", "status", str(tmp_path / "missing.img")]) == 2
    assert "luks_error" in capsys.readouterr().err
