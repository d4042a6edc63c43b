"""What ``nodegate serve`` checks before it writes anything, and how it takes back what a failed
start wrote.

``check`` runs first: every mistake it finds is one line (``StartupError``) that names the key or
file that is wrong, and nothing has been created yet. Whatever can only fail later (the store, the
Kubernetes API, a port taken between the check and the bind) is covered by
``nothing_left_behind``: files and folders under ``state_dir`` that a failed start created (a new
CA, ``session.key``, the sqlite file, ``store.id``, the TLS certificate) are removed again, so the
next start sees the same state_dir as this one did.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import socket
import ssl
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

from bootstrap.config import Settings, host_port
from bootstrap.kube.configuration import check_kubeconfig_file
from bootstrap.kube.errors import KubeConfigError
from bootstrap.names import is_loopback
from bootstrap.service.join import ekroots
from bootstrap.service.pki import hostnames
from bootstrap.service.pki.startup import StartupError

log = logging.getLogger("nodegate.server")

_WALK_DEPTH: Final = 3  # state_dir, ca/ and tls/ and their files; nothing nodegate writes is deeper


def check(settings: Settings, *, insecure_plaintext: bool = False) -> list[str]:
    """Raise StartupError for the first mistake; return the warnings (also logged)."""
    check_state_dir(settings.state_dir)
    if not insecure_plaintext:
        check_tls_files(settings)
    check_ek_roots(settings)
    check_files(settings)
    check_listen(settings.listen)
    check_listen(settings.admission.listen, key="admission.listen")
    found = warnings(settings, insecure_plaintext=insecure_plaintext)
    for text in found:
        log.warning(text)
    return found


def check_files(settings: Settings) -> None:
    """Every other file the config names can be read."""
    if settings.kubernetes.kubeconfig is not None:
        try:  # the words `gate` and `kubectl nodegate` use for the same mistake
            check_kubeconfig_file(settings.kubernetes.kubeconfig)
        except KubeConfigError as exc:
            raise StartupError(f"kubernetes.kubeconfig: {exc}") from None
    _files("kubernetes.kubelet_api_ca_file", [settings.kubernetes.kubelet_api_ca_file])
    _files("admission.policy_files", settings.admission.policy_files or ())
    _files("admission.rbac_files", settings.admission.rbac_files or ())


def _readable(key: str, path: Path) -> None:
    try:
        with path.open("rb"):
            pass
    except FileNotFoundError:
        raise StartupError(f"{key}: {path} does not exist") from None
    except IsADirectoryError:
        raise StartupError(f"{key}: {path} is a folder, not a file") from None
    except OSError as exc:
        raise StartupError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None


def _files(key: str, paths: Iterable[Path | None]) -> None:
    for path in paths:
        if path is not None:
            _readable(key, path)


def check_state_dir(state: Path) -> None:
    if state.exists():
        if not state.is_dir():
            raise StartupError(f"state_dir: {state} is not a folder")
        if not os.access(state, os.W_OK | os.X_OK):
            raise StartupError(
                f"state_dir: {state} is not writable by this user (uid {os.geteuid()}); fix its owner or mode"
            )
        return
    parent = state.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise StartupError(
            f"state_dir: {state} does not exist and cannot be created ({parent} is not writable by uid "
            f"{os.geteuid()}); create it for nodegate's user"
        )


def check_tls_files(settings: Settings) -> None:
    cert, key = settings.tls.cert_file, settings.tls.key_file
    if cert is None and key is None:
        return
    if cert is None or key is None:
        given, missing = (
            ("tls.cert_file", "tls.key_file") if cert is not None else ("tls.key_file", "tls.cert_file")
        )
        raise StartupError(
            f"{given} is set but {missing} is not: set both, or neither for a self-issued certificate"
        )
    _readable("tls.cert_file", cert)
    _readable("tls.key_file", key)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        reason = exc.reason or str(exc)
        raise StartupError(
            f"tls.cert_file {cert} and tls.key_file {key} do not load as a certificate and its key "
            f"({reason}); both PEM, the key unencrypted and matching the certificate"
        ) from None


def check_ek_roots(settings: Settings) -> None:
    """A path that does not exist, or a folder or root store that yields nothing, is a mistake in
    the config; a single unusable file inside a folder stays a warning (``/readyz``). A cloud vTPM
    CA without a binding under ``enrollment: tofu`` is refused (docs/ek-roots.md, "Cloud vTPMs")."""
    _check_cloud_cas(settings)
    for entry in settings.ek_roots:
        if entry in (Path(ekroots.VENDORS), Path(ekroots.IMPORTED)):
            roots = ekroots.load_roots([entry], state_dir=settings.state_dir)
            if not roots.anchors:
                why = roots.skipped[0][1] if roots.skipped else "no usable root"
                # Each message written out: troubleshooting.md quotes them (test_docs_in_step).
                if entry == Path(ekroots.VENDORS):
                    raise StartupError(f"ek_roots: vendors: yields no trust anchor: {why}")
                raise StartupError(f"ek_roots: imported: yields no trust anchor: {why}")
            continue
        path = entry
        if not path.exists():
            raise StartupError(f"ek_roots: {path} does not exist")
        if not path.is_dir():
            continue  # a bad single file is skipped with a warning, as before
        roots = ekroots.load_roots([entry])
        store = (path / ekroots.MANIFEST).is_file()
        if (store and not roots.anchors) or not (roots.anchors or roots.intermediates):
            first = f" ({roots.skipped[0][0]}: {roots.skipped[0][1]})" if roots.skipped else ""
            what = "root store" if store else "folder"
            raise StartupError(
                f"ek_roots: the {what} {path} yields no trust anchor; {len(roots.skipped)} files "
                f"skipped{first}"
            )


def _check_cloud_cas(settings: Settings) -> None:
    """TOFU binds a node name to whichever EK comes first; with a cloud vTPM CA trusted and no
    binding, "whichever" is any VM of that cloud. Such chains are refused at join anyway (attest
    cloudek); refusing the config says so at start instead of on every join."""
    if settings.enrollment != "tofu":
        return
    roots = ekroots.load_roots(settings.ek_roots, state_dir=settings.state_dir)
    unbound = ekroots.unbound_cloud_cas(settings, roots)
    if unbound:
        cert, provider = unbound[0]
        fix = (
            "set ek_cloud.gce.projects (or instances) to your own"
            if provider == "gce"
            else "remove it from ek_roots and allowlist those EKs (no per-VM binding exists for it)"
        )
        raise StartupError(
            f"ek_roots: {cert.name()} ({roots.origins.get(cert.sha256)}) is a {provider} "
            "cloud vTPM CA, which certifies every VM of that cloud; "
            f"with enrollment: tofu and no binding any such VM could join: {fix} (docs/ek-roots.md)"
        )


def check_listen(listen: str, *, key: str = "listen") -> None:
    """The port is free and the address is on this host (checked by binding it for a moment)."""
    host, port = host_port(listen)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"{key} {listen}: cannot resolve {host} ({exc.strerror})") from None
    for family, kind, proto, _, addr in infos[:1]:
        with socket.socket(family, kind, proto) as probe:
            # as the listener itself binds (asyncio sets SO_REUSEADDR on POSIX)
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(addr)
                probe.listen(1)
            except OSError as exc:
                raise StartupError(_bind_error(key, listen, host, port, exc)) from None


def _bind_error(key: str, listen: str, host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"{key} {listen}: port {port} is already in use (another nodegate?); stop it or change {key}"
    if exc.errno == errno.EACCES:
        return f"{key} {listen}: port {port} needs privileges (below 1024: root or CAP_NET_BIND_SERVICE)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{key} {listen}: {host} is not an address of this host"
    return f"{key} {listen}: cannot bind: {exc.strerror or exc}"


def warnings(settings: Settings, *, insecure_plaintext: bool) -> list[str]:
    out: list[str] = []
    host, _ = host_port(settings.listen)
    if settings.tls.cert_file is None and not insecure_plaintext and not is_loopback(host):
        names = hostnames.server_names(settings)
        if all(is_loopback(n) for n in names):
            out.append(
                f"server_names {list(names)} name only this host's loopback, but listen is "
                f"{settings.listen}: "
                "nodes dialling any other name fail TLS; list the names nodes use in server_names"
            )
    if not settings.ek_roots and not settings.ek_allowlist:
        out.append("neither ek_roots nor ek_allowlist is set: no EK is trusted, so every join is refused")
    return out


# -- a failed start leaves nothing behind ---------------------------------------------------------


def _tree(state: Path) -> set[Path]:
    found: set[Path] = set()

    def walk(folder: Path, depth: int) -> None:
        try:
            entries = list(folder.iterdir())
        except OSError:
            return
        for p in entries:
            found.add(p)
            if depth > 1 and p.is_dir() and not p.is_symlink():
                walk(p, depth - 1)

    walk(state, _WALK_DEPTH)
    return found


@contextlib.contextmanager
def nothing_left_behind(state: Path) -> Iterator[None]:
    """Remove what the body created under ``state`` (and ``state`` itself, when the body created
    it) if the body raises; what was there before is never touched."""
    existed = state.exists()
    before = _tree(state) if existed else set()
    try:
        yield
    except BaseException:
        _remove_new(state, existed, before)
        raise


def _remove_new(state: Path, existed: bool, before: set[Path]) -> None:
    if not existed:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(state)
        return
    # deepest first, so a new folder is empty when its turn comes
    for p in sorted(_tree(state) - before, key=lambda q: len(q.parts), reverse=True):
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except OSError as exc:  # reported, not hidden: the next start may trip over it
            log.warning("could not remove %s after the failed start", p, extra={"error": str(exc)[:200]})
