"""Files that are not firmware event logs get one line saying what they are (an IMA list, a YAML
dump, a compressed copy, ...), in ``nodegate eventlog inspect`` and for ``--event-log``; real TCG
logs are never named."""

from __future__ import annotations

import gzip
import hashlib
import logging
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attest import eventlog, filekind
from attest.errors import EventLogInvalid
from bootstrap import cli
from bootstrap.node.errors import JoinUsageError
from bootstrap.node.evidence import read_boot_evidence
from tests.support import realtpm


def _ima_binary(ascii_log: bytes) -> bytes:
    """The kernel's binary_runtime_measurements for the same ima-ng records (little-endian host)."""
    out = b""
    for line in ascii_log.decode().splitlines():
        pcr, template_digest, name, file_digest, path = line.split(" ", 4)
        algo, hexdigest = file_digest.split(":")
        digest_field = algo.encode() + b":\0" + bytes.fromhex(hexdigest)
        data = struct.pack("<I", len(digest_field)) + digest_field
        data += struct.pack("<I", len(path) + 1) + path.encode() + b"\0"
        out += struct.pack("<I", int(pcr)) + bytes.fromhex(template_digest)
        out += struct.pack("<I", len(name)) + name.encode() + struct.pack("<I", len(data)) + data
    return out


# Real files from the public test data, read when a test asks (a test without them skips alone).
def _ima_ascii() -> bytes:
    return realtpm.data("not-logs/ima-log-sha256.txt")


def _ima_binary_real() -> bytes:
    return _ima_binary(_ima_ascii())


def _tcg_log(name: str) -> bytes:
    if name == "gce":
        return realtpm.gce_attestation(realtpm.data("attestations/gce-cos-85-nonce9009.pb")).event_log
    return realtpm.windows_attestation(realtpm.data("attestations/windows-gcp-shielded-vm.json")).event_log


def _real(name: str) -> Callable[[], bytes]:
    return lambda: realtpm.data(name)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (_ima_ascii, "an IMA runtime measurement list (ASCII, template ima-ng)"),
        (_real("not-logs/ima-log-sha1.txt"), "an IMA runtime measurement list (ASCII, template ima-ng)"),
        (_ima_binary_real, "an IMA runtime measurement list (binary, template ima-ng)"),
        (_real("not-logs/binary_bios_measurements-bogus"), "a text file (first line: 'bogus')"),
        (b"---\nversion: 1\nevents:\n- EventNum: 0\n", "a YAML document (tpm2_eventlog's output?)"),
        (b'{"events": []}', "a JSON document"),
        (b"-----BEGIN CERTIFICATE-----\nMIIB\n", "a PEM file (certificate)"),
        (lambda: gzip.compress(_tcg_log("gce")), "a gzip-compressed file"),
        (b"\x7fELF\x02\x01\x01" + bytes(60), "an ELF executable"),
        (b"", "the file is empty"),
    ],
)
def test_what_a_file_is(data: bytes | Callable[[], bytes], needle: str) -> None:
    text = filekind.describe(data if isinstance(data, bytes) else data())
    assert text is not None
    assert text.startswith(needle)
    assert filekind.FIRMWARE_LOG in text
    assert "\n" not in text


@pytest.mark.parametrize("name", ["gce", "windows"])
def test_real_tcg_logs_are_never_named(name: str) -> None:
    log = _tcg_log(name)
    eventlog.parse(log)  # a real log that parses
    assert filekind.describe(log) is None


@given(st.binary(max_size=64))
def test_random_binary_is_left_to_the_parser(data: bytes) -> None:
    """A log starts with PCR 0 as four zero bytes, never text: whatever follows, nothing is
    named but an IMA list, and nothing raises."""
    result = filekind.describe(b"\x00\x00\x00\x00" + data)
    assert result is None or "IMA" in result


def test_ima_lists_do_not_parse_as_event_logs() -> None:
    for data in (_ima_ascii(), _ima_binary_real()):
        with pytest.raises(EventLogInvalid):
            eventlog.parse(data)


def _inspect(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(["eventlog", "inspect", str(path)])
    return code, capsys.readouterr().err


def test_inspect_names_an_ima_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "binary_runtime_measurements"
    path.write_bytes(_ima_binary_real())
    code, err = _inspect(path, capsys)
    assert code == 1
    assert err.startswith(f"nodegate eventlog inspect: {path}: an IMA runtime measurement list (binary")
    assert err.strip().endswith("[event_log_invalid]")
    assert "claims" not in err
    assert len(err.strip().splitlines()) == 1


def test_inspect_of_a_damaged_tcg_log_keeps_the_parsers_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log.bin"
    path.write_bytes(_tcg_log("gce")[:-7])
    code, err = _inspect(path, capsys)
    assert code == 1
    assert "IMA" not in err
    assert "[event_log_invalid]" in err


def test_join_refuses_to_send_an_ima_list_named_as_the_event_log(tmp_path: Path) -> None:
    path = tmp_path / "ascii_runtime_measurements"
    path.write_bytes(_ima_ascii())
    with pytest.raises(JoinUsageError, match=r"--event-log .*: an IMA runtime measurement list \(ASCII"):
        read_boot_evidence("swtpm:port=1", _log(), boot_id_path=None, event_log_path=path)
    good = tmp_path / "binary_bios_measurements"
    good.write_bytes(_tcg_log("windows"))
    boot = read_boot_evidence("swtpm:port=1", _log(), boot_id_path=None, event_log_path=good)
    assert boot.event_log is not None
    assert hashlib.sha256(boot.event_log).digest() == hashlib.sha256(_tcg_log("windows")).digest()


def _log() -> logging.Logger:
    return logging.getLogger("test")
