"""The files SPIRE's x509pop server plugin reads, kept current by nodegate (docs/spire.md).

SPIRE loads ``ca_bundle_path`` when it configures the plugin, and configures it again only on
SIGUSR1 *and* only when the plugin data (the HCL text, not the bundle) changed. So nodegate
writes the PEM bundle and a ``plugin_data_file`` whose text carries the bundle's digest: every CA
change (rotation, retirement) changes both, and one SIGUSR1 makes SPIRE read the new roots.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path

from bootstrap.files import read_limited, write_atomic

AGENT_PREFIX = "spiffe://{trust_domain}/spire/agent"
# nodegate's ID placeholders -> the x509pop SAN selector SPIRE's template reads them from.
_PLACEHOLDERS = {
    "{node_name}": '{{ index .URISanSelectors "node" }}',
    "{ek_sha256}": '{{ index .URISanSelectors "ek-sha256" }}',
    # A certificate without it gives an ID with an empty last segment, which SPIRE refuses.
    "{attestation}": '{{ index .URISanSelectors "attestation" }}',
}
_MAX_PID_FILE = 64


def agent_path_template(agent_id_template: str) -> str:
    """SPIRE's ``agent_path_template`` that makes the agent ID nodegate's template names."""
    if not agent_id_template.startswith(AGENT_PREFIX + "/"):
        raise ValueError(f"agent_id_template must start with {AGENT_PREFIX}/")
    path = agent_id_template[len(AGENT_PREFIX) :]
    for placeholder, selector in _PLACEHOLDERS.items():
        path = path.replace(placeholder, selector)
    return path


def plugin_data(bundle_file: Path, bundle_pem: bytes, agent_id_template: str) -> bytes:
    """The x509pop ``plugin_data`` (HCL); the comment changes with the bundle's content."""
    digest = hashlib.sha256(bundle_pem).hexdigest()
    lines = [
        "# Written by nodegate (docs/spire.md); rewritten on every change of its CA bundle.",
        f"# bundle sha256 {digest}",
        'mode = "external_pki"',
        f"ca_bundle_path = {json.dumps(str(bundle_file))}",
        f"agent_path_template = {json.dumps(agent_path_template(agent_id_template))}",
    ]
    return ("\n".join(lines) + "\n").encode()


def write_plugin_files(
    bundle_file: Path,
    plugin_data_file: Path,
    bundle_pem: bytes,
    agent_id_template: str,
    server_pid_file: Path | None,
) -> bool:
    """Write the bundle, then the plugin data naming it, then signal SPIRE; nothing when both
    already hold this bundle. True when something changed."""
    data = plugin_data(bundle_file, bundle_pem, agent_id_template)
    try:
        same = read_limited(bundle_file) == bundle_pem and read_limited(plugin_data_file) == data
    except (OSError, ValueError):
        same = False
    if same:
        return False
    # The pid first: a pid file that cannot be used stops before anything is written, so the next
    # attempt still sees a change to write and signal. Absent: SPIRE has not started yet, and
    # reads the files when it does.
    pid = _read_pid(server_pid_file) if server_pid_file is not None and server_pid_file.exists() else None
    # Public certificates: readable by the SPIRE server's own user.
    write_atomic(bundle_file, bundle_pem, mode=0o644)
    write_atomic(plugin_data_file, data, mode=0o644)
    if pid is not None:
        os.kill(pid, signal.SIGUSR1)
    return True


def _read_pid(path: Path) -> int:
    # SIGUSR1 ends most processes: whoever could write the pid file could have nodegate kill them.
    if path.stat().st_mode & 0o022:
        raise OSError(f"{path} is writable by its group or others: SPIRE not signalled")
    text = read_limited(path, _MAX_PID_FILE).decode("ascii", "replace").strip()
    if not text.isdigit() or int(text) <= 1:
        raise OSError(f"{path} holds no process id")
    return int(text)
