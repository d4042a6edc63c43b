"""Software TPMs for tests and the demo: swtpm (swtpm / libtpms) with EK certificates from a local CA.

A session-wide CA lives in a private XDG config folder, so nothing touches /etc or the user's
home. Each TPM is manufactured once by ``swtpm_setup --create-ek-cert --create-platform-cert``
and served by ``swtpm socket`` on a free loopback port.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from tpm2_pytss import ESAPI, TPM2_CAP, TPM2_HC, TPM2_SU

from bootstrap.node.tpm import flush_raw, transient_handles


class SwtpmMissing(RuntimeError):
    pass


def require_tools() -> None:
    missing = [t for t in ("swtpm", "swtpm_setup", "swtpm_localca") if shutil.which(t) is None]
    if missing:
        raise SwtpmMissing(f"{', '.join(missing)} not installed; run `make deps`")


@dataclass
class LocalCa:
    """The swtpm_localca CA shared by every TPM of a test session."""

    xdg: Path

    @property
    def dir(self) -> Path:
        return self.xdg / "var" / "lib" / "swtpm-localca"

    @property
    def root(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate((self.dir / "swtpm-localca-rootca-cert.pem").read_bytes())

    @property
    def intermediate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate((self.dir / "issuercert.pem").read_bytes())

    def env(self) -> dict[str, str]:
        return {**os.environ, "XDG_CONFIG_HOME": str(self.xdg)}


def make_ca(xdg: Path) -> LocalCa:
    require_tools()
    xdg.mkdir(parents=True, exist_ok=True)
    ca = LocalCa(xdg)
    # 'root' lets this run as root (CI) without swtpm_setup refusing to shadow /etc.
    subprocess.run(
        ["swtpm_setup", "--create-config-files", "skip-if-exist,root"],
        env=ca.env(),
        check=True,
        capture_output=True,
    )
    return ca


def manufacture(ca: LocalCa, state: Path) -> None:
    """A new TPM: RSA-2048 and ECC P-384 EKs with certificates, a platform certificate, sha256."""
    state.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            "swtpm_setup",
            "--tpm2",
            "--tpmstate",
            str(state),
            "--create-ek-cert",
            "--create-platform-cert",
            "--lock-nvram",
            "--pcr-banks",
            "sha256",
        ],
        env=ca.env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"swtpm_setup failed: {proc.stderr[-2000:]}")


@dataclass
class Swtpm:
    """A running software TPM."""

    ca: LocalCa
    state: Path
    process: subprocess.Popen[bytes]
    port: int
    ctrl_port: int

    @property
    def tcti(self) -> str:
        return f"swtpm:host=127.0.0.1,port={self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def power_off(self) -> None:
        """An orderly power-off, as the kernel does on reboot: TPM2_Shutdown(CLEAR) first, so the
        TPM keeps its clock marked safe (a crash instead leaves it unsafe: ``clock_unsafe``)."""
        ctx = ESAPI(self.tcti)
        try:
            ctx.shutdown(TPM2_SU.CLEAR)
        finally:
            ctx.close()
        self.stop()

    def flush_transients(self) -> int:
        """Flush every transient object and session left in the TPM; return how many."""
        ctx = ESAPI(self.tcti)
        try:
            handles = transient_handles(ctx)
            for first in (TPM2_HC.LOADED_SESSION_FIRST, TPM2_HC.ACTIVE_SESSION_FIRST):
                _, data = ctx.get_capability(TPM2_CAP.HANDLES, first, 64)
                h = data.data.handles
                handles += [int(h[i]) for i in range(h.count)]
            for handle in handles:
                flush_raw(ctx, handle)
            return len(handles)
        finally:
            ctx.close()


def _free_port_pair() -> int:
    """A port P with P+1 also free: the swtpm TCTI expects the control channel on P+1."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no free pair of loopback ports")


def _wait_ready(proc: subprocess.Popen[bytes], port: int, deadline_s: float = 20.0) -> bool:
    """Wait until swtpm accepts on ``port`` or exits, within a deadline. (swtpm cannot take a
    pre-bound listening data socket: its fd= means an already connected one.)"""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.02)
    return False


def start(ca: LocalCa, state: Path, attempts: int = 5) -> Swtpm:
    """Serve ``state`` on free loopback ports (data P, control P+1); retry if a port was taken."""
    for _ in range(attempts):
        port = _free_port_pair()
        proc = subprocess.Popen(
            [
                "swtpm",
                "socket",
                "--tpm2",
                "--tpmstate",
                f"dir={state}",
                "--server",
                f"type=tcp,port={port},bindaddr=127.0.0.1",
                "--ctrl",
                f"type=tcp,port={port + 1},bindaddr=127.0.0.1",
                "--flags",
                "not-need-init",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches the demo, which stops swtpm after its users
        )
        if _wait_ready(proc, port):
            return Swtpm(ca, state, proc, port, port + 1)
        proc.kill()
        proc.wait()
    raise RuntimeError(f"swtpm did not start on a free port after {attempts} attempts")
