"""Node side of the join protocol: `nodegate join` (DESIGN.md, "Join protocol").

    result = await join(JoinOptions(server="https://join.example:8443", ca_bundle=Path("ca.pem"),
                                    node_name="gpu-017"))

The node key (ECDSA P-256, ``out/node.key``) stays on the node; the server only sees a CSR for
it. The TPM proves the AK lives next to the EK (credential activation) and signs a quote over a
nonce bound to that CSR. Transient failures (network, timeouts, 429/5xx, expired sessions) are
retried with capped exponential backoff and full jitter; every other refusal is final and carries
the server's machine code. Files are written only once the whole answer has been checked.

Exit statuses (``main``, and ``bootstrap.node.renew.renew_main``): 0 done, 1 refused by the server
(or its answer failed our checks), 2 usage or a local problem (options, files, TPM, TLS trust),
75 (EX_TEMPFAIL) transient failures outlasted the attempts, so a supervisor should try again later.
The shared pieces of `nodegate renew` (HTTP, TPM, retries, checks) live here too.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import concurrent.futures
import contextlib
import email.utils
import fcntl
import functools
import hashlib
import hmac
import json
import logging
import math
import os
import random
import re
import ssl
import stat
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Annotated, Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import NameOID
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from attest import svid as svidlib
from attest import wire
from attest.errors import AttestationError
from bootstrap.files import ensure_dir, read_limited, write_atomic
from bootstrap.names import is_loopback, is_node_name

if TYPE_CHECKING:
    from bootstrap.node import tpm as agent

__all__ = [
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_TEMPFAIL",
    "EXIT_USAGE",
    "JoinFailed",
    "JoinGaveUp",
    "JoinOptions",
    "JoinResult",
    "JoinUsageError",
    "add_arguments",
    "exit_status",
    "join",
    "main",
]

log = logging.getLogger("nodegate.join")

BACKOFF_CAP = 30.0
MAX_RESPONSE = 1024 * 1024
MAX_KEY_FILE = 64 * 1024
_TRANSIENT_STATUS = frozenset({429, 502, 503, 504})
_RESTART_CODES = frozenset({"session_expired", "session_unknown"})
_STATUS_CODES = {
    429: "rate_limited",
    502: "server_unavailable",
    503: "server_unavailable",
    504: "server_unavailable",
}
_MACHINE_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")
_DETAIL_LIMIT = 300

# Same as bootstrap.node.tpm.DEFAULT_TCTI (a test holds them equal); repeated so that building the
# command line does not load tpm2-pytss and libtss2.
DEFAULT_TCTI = "device:/dev/tpmrm0"
KEY_FILE = "node.key"
SVID_FILE = "svid.pem"
BUNDLE_FILE = "bundle.pem"
KUBECONFIG_FILE = "kubelet.kubeconfig"
INDEX_FILE = "join.json"


def _one_line(text: object, limit: int = _DETAIL_LIMIT) -> str:
    """Server- or library-provided text made safe for one terminal line."""
    s = " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


class JoinFailed(Exception):
    """The join was refused or cannot succeed by retrying. ``code`` is the server's machine code
    or a local one (``tpm_unavailable``, ``tls_untrusted``, ``bad_response``, ...); ``status`` is
    the HTTP status when the server answered."""

    def __init__(self, code: str, detail: str = "", status: int | None = None) -> None:
        self.code = code
        self.status = status
        self.detail = _one_line(detail or code)
        super().__init__(self.detail)

    def __str__(self) -> str:
        return self.detail

    def __repr__(self) -> str:
        return f"JoinFailed(code={self.code!r}, status={self.status!r}, detail={self.detail!r})"


class JoinGaveUp(JoinFailed):
    """Transient failures (service down, overloaded or unreachable) outlasted the attempts: trying
    again later may well work, unlike a refusal."""


class JoinUsageError(ValueError):
    """Options that cannot work (bad URL, unreadable CA bundle, invalid node name)."""


EXIT_OK = 0
EXIT_REFUSED = 1  # the server's machine code, or an answer that failed our checks: final
EXIT_USAGE = 2  # options, local files, the TPM, TLS trust: something on this machine must change
EXIT_TEMPFAIL = 75  # EX_TEMPFAIL (sysexits.h): systemd's Restart=on-failure retries it


def exit_status(exc: JoinFailed | JoinUsageError) -> int:
    if isinstance(exc, JoinUsageError):
        return EXIT_USAGE
    if isinstance(exc, JoinGaveUp):
        return EXIT_TEMPFAIL
    if exc.status is not None or exc.code == "bad_response":
        return EXIT_REFUSED
    return EXIT_USAGE


def report_failure(prog: str, exc: JoinFailed | JoinUsageError) -> int:
    """The one stderr line for a failed ``prog``; returns its exit status."""
    status = exit_status(exc)
    if isinstance(exc, JoinUsageError):
        print(f"{prog}: {_one_line(exc)}", file=sys.stderr)
        return status
    where = exc.code if exc.status is None else f"{exc.code}, HTTP {exc.status}"
    verb = {EXIT_REFUSED: "refused", EXIT_TEMPFAIL: "gave up"}.get(status, "failed")
    print(f"{prog}: {verb} ({where}): {exc}", file=sys.stderr)
    return status


def check_retry_options(attempts: int, backoff: float, timeout: float) -> None:
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise JoinUsageError("attempts must be a positive integer")
    if not (math.isfinite(backoff) and backoff >= 0):
        raise JoinUsageError("backoff must be a non-negative number of seconds")
    if not (math.isfinite(timeout) and timeout > 0):
        raise JoinUsageError("timeout must be a positive number of seconds")


@dataclass(frozen=True)
class JoinOptions:
    server: str  # https://host:port (http:// only for loopback hosts: the --insecure-plaintext dev server)
    ca_bundle: Path  # PEM roots to trust for the server's TLS certificate (and nothing else)
    node_name: str
    tcti: str = DEFAULT_TCTI
    out: Path = Path("/var/lib/nodegate-node")
    ek_kind: str = "rsa"  # "rsa" | "ecc"
    attempts: int = 8  # total tries for transient failures
    backoff: float = 1.0  # first delay ceiling in seconds; doubles per failure, capped at 30 s
    timeout: float = 30.0  # per request

    def __post_init__(self) -> None:
        _base_url(self.server)
        if not is_node_name(self.node_name):
            raise JoinUsageError(
                f"node name {_one_line(repr(self.node_name), 80)} is not a lowercase RFC 1123 DNS name"
            )
        if self.ek_kind not in ("rsa", "ecc"):
            raise JoinUsageError(f"EK kind must be 'rsa' or 'ecc', not {_one_line(repr(self.ek_kind), 40)}")
        check_retry_options(self.attempts, self.backoff, self.timeout)


@dataclass(frozen=True)
class JoinResult:
    node_name: str
    spiffe_id: str
    svid_expires_at: str
    files: dict[str, Path] = field(default_factory=dict)


def _base_url(server: str) -> str:
    if not isinstance(server, str):
        raise JoinUsageError("server must be a URL string")
    try:
        parts = urlsplit(server)
        host = parts.hostname
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as exc:
        raise JoinUsageError(f"server URL {_one_line(server, 100)!r} does not parse: {exc}") from None
    if parts.scheme not in ("https", "http") or not host:
        raise JoinUsageError(f"server must be https://host[:port], not {_one_line(server, 100)!r}")
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise JoinUsageError("server URL must not carry credentials, a query or a fragment")
    if parts.scheme == "http" and not is_loopback(host):
        raise JoinUsageError(
            "plain http:// is only allowed to a loopback host (the dev server); use https://"
        )
    return server.rstrip("/")


def _ssl_context(ca_bundle: Path) -> ssl.SSLContext:
    """Trust exactly the roots in ``ca_bundle``: with an explicit cafile the stdlib does not load
    the system roots. Hostnames are checked."""
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca_bundle))
    except FileNotFoundError:
        raise JoinUsageError(f"CA bundle {ca_bundle} does not exist") from None
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise JoinUsageError(f"CA bundle {ca_bundle} holds no usable PEM certificates ({exc})") from None
    if not ctx.get_ca_certs():
        raise JoinUsageError(f"CA bundle {ca_bundle} holds no CA certificates")
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


# -- wire models ------------------------------------------------------------------------------


def _b64(value: object) -> bytes:
    if not isinstance(value, str):
        raise ValueError("must be a base64 string")  # noqa: TRY004  (pydantic wants ValueError)
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        raise ValueError("is not standard base64") from None


def _b64e(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


B64 = Annotated[bytes, BeforeValidator(_b64)]


def _nonce32(v: bytes) -> bytes:
    if len(v) != 32:
        raise ValueError(f"must be 32 bytes, not {len(v)}")
    return v


def _quotable(v: str) -> str:
    try:
        wire.parse_selection_string(v)
    except AttestationError as exc:
        raise ValueError(exc.detail) from None
    return v


Nonce = Annotated[bytes, BeforeValidator(_b64), AfterValidator(_nonce32)]
Selection = Annotated[str, AfterValidator(_quotable)]


class _StartResponse(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    session: str = Field(min_length=1, max_length=8192)
    credential_blob: B64
    encrypted_secret: B64
    nonce: Nonce
    pcr_selection: Selection
    expires_at: str


class _FinishResponse(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    node_name: str
    spiffe_id: str = Field(max_length=svidlib.MAX_ID_BYTES)
    svid: str
    bundle: str
    svid_expires_at: str = Field(max_length=64)
    kubeconfig: str | None = None


class _Problem(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    code: str
    detail: str | None = None
    title: str | None = None

    @field_validator("code")
    @classmethod
    def _code(cls, v: str) -> str:
        if not _MACHINE_CODE.fullmatch(v):
            raise ValueError("not a machine code")
        return v


M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class _Transient(Exception):
    """A failure worth another try; ``restart_now`` skips the backoff (a fresh session fixes it)."""

    def __init__(
        self,
        code: str,
        detail: str,
        status: int | None = None,
        *,
        retry_after: float | None = None,
        restart_now: bool = False,
    ) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = _one_line(detail)
        self.status = status
        self.retry_after = retry_after
        self.restart_now = restart_now


def _retry_after(value: str | None) -> float | None:
    """Retry-After as delta-seconds or an HTTP date, never negative."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(int(value[:12]))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _problem(content_type: str, raw: bytes) -> _Problem | None:
    if content_type not in ("application/problem+json", "application/json"):
        return None
    try:
        return _Problem.model_validate_json(raw)
    except ValidationError:
        return None


class _Http:
    def __init__(self, session: aiohttp.ClientSession, base: str, ca_bundle: Path) -> None:
        self.session = session
        self.base = base
        self.ca_bundle = ca_bundle

    async def post(self, path: str, body: dict[str, Any], model: type[M]) -> M:
        """POST JSON; return the parsed 2xx answer, raise JoinFailed (final) or _Transient."""
        url = self.base + path
        try:
            async with self.session.post(
                url, json=body, allow_redirects=False, headers={"Accept": "application/json"}
            ) as resp:
                raw = await _read_limited(resp)
                status = resp.status
                content_type = resp.content_type
                retry_after = _retry_after(resp.headers.get("Retry-After"))
        except aiohttp.ClientConnectorCertificateError as exc:
            raise JoinFailed(
                "tls_untrusted",
                f"{path}: the server's TLS certificate is not trusted by {self.ca_bundle} "
                f"or does not name the host ({exc.certificate_error})",
            ) from None
        except aiohttp.ClientSSLError as exc:
            raise JoinFailed("tls_error", f"{path}: TLS handshake with the server failed ({exc})") from None
        except TimeoutError:
            raise _Transient("timeout", f"{path}: no complete answer within the request timeout") from None
        except _TooLarge:
            raise _Transient(
                "bad_response", f"{path}: the answer is larger than {MAX_RESPONSE} bytes"
            ) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise _Transient("server_unreachable", f"{path}: {type(exc).__name__}: {exc}") from None
        if 200 <= status < 300:
            try:
                return model.model_validate_json(raw)
            except ValidationError as exc:
                first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid"}
                where = ".".join(str(p) for p in first["loc"]) or "body"
                raise _Transient(
                    "bad_response",
                    f"{path}: HTTP {status} answer is not protocol JSON ({where}: {first['msg']})",
                ) from None
        problem = _problem(content_type, raw)
        if status in _TRANSIENT_STATUS or status >= 500:
            code = problem.code if problem else _STATUS_CODES.get(status, "server_error")
            detail = (problem.detail or problem.title) if problem else None
            raise _Transient(
                code, f"{path}: HTTP {status}: {detail or code}", status, retry_after=retry_after
            )
        if problem is None:
            raise _Transient("bad_response", f"{path}: HTTP {status} without a problem document", status)
        raise JoinFailed(problem.code, problem.detail or problem.title or problem.code, status)


class _TooLarge(Exception):
    pass


async def _read_limited(resp: aiohttp.ClientResponse) -> bytes:
    if resp.content_length is not None and resp.content_length > MAX_RESPONSE:
        raise _TooLarge
    chunks: list[bytes] = []
    total = 0
    async for chunk in resp.content.iter_chunked(64 * 1024):
        total += len(chunk)
        if total > MAX_RESPONSE:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


# -- TPM, on one worker thread (ESAPI contexts are not meant to be shared between threads) ------


class _Tpm:
    """The AK, and the EK when ``ek_kind`` is given (a renewal only quotes: no EK). The AK is a
    primary of the endorsement hierarchy, so every run recreates the key the join registered."""

    def __init__(self, tcti: str, ek_kind: agent.EkKind | None) -> None:
        self._tcti = tcti
        self._ek_kind: agent.EkKind | None = ek_kind
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="nodegate-tpm")
        self._agent: agent.Agent | None = None
        self.ek: agent.Ek | None = None
        self.ak: agent.Key | None = None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        from bootstrap.node import tpm as agent  # noqa: PLC0415  (loads libtss2; only when joining)

        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, functools.partial(fn, *args))
        except agent.TpmUnavailable as exc:
            raise JoinFailed("tpm_unavailable", str(exc)) from None
        except agent.TpmLockedOut as exc:
            raise JoinFailed("tpm_locked_out", str(exc)) from None
        except agent.TpmError as exc:
            raise JoinFailed("tpm_error", str(exc)) from None
        except AttestationError as exc:  # a server value agent.py refused before the TPM saw it
            raise JoinFailed("bad_response", exc.detail) from None

    def _open(self) -> None:
        from bootstrap.node import tpm as agent  # noqa: PLC0415

        a = agent.Agent(self._tcti)
        a.__enter__()
        self._agent = a
        if self._ek_kind is not None:
            self.ek = a.create_ek(self._ek_kind)  # reads the EK certificate from NV too
        self.ak = a.create_ak()

    async def __aenter__(self) -> _Tpm:
        try:
            await self._run(self._open)
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._close()

    async def _close(self) -> None:
        if self._agent is not None:
            a, self._agent = self._agent, None
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._pool, a.close)
        self._pool.shutdown(wait=False)

    def require(self) -> tuple[agent.Agent, agent.Key]:
        if self._agent is None or self.ak is None:
            raise JoinFailed("tpm_error", "the TPM connection is closed")
        return self._agent, self.ak

    def require_ek(self) -> agent.Ek:
        if self.ek is None:
            raise JoinFailed("tpm_error", "the EK is not loaded")
        return self.ek

    async def activate(self, blob: bytes, encrypted: bytes) -> bytes:
        a, ak = self.require()
        return await self._run(a.activate_credential, ak, self.require_ek(), blob, encrypted)

    async def quote(
        self, selection: str, qualifying_data: bytes
    ) -> tuple[bytes, bytes, dict[str, dict[int, bytes]]]:
        a, ak = self.require()
        return await self._run(a.quote_with_pcrs, ak, selection, qualifying_data)


# -- node key and CSR ---------------------------------------------------------------------------


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _spki(public: PublicKeyTypes) -> bytes:
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _read_node_key(path: Path, unusable: str) -> ec.EllipticCurvePrivateKey | None:
    """The P-256 key at ``path`` (narrowed to mode 0600), or None when there is none or it is not
    one (logged with ``unusable``)."""
    try:
        data = read_limited(path, MAX_KEY_FILE)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise JoinFailed("file_error", f"cannot read {path}: {exc}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        key = None  # details could quote key material
    if not (isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1)):
        log.warning("%s is not an unencrypted ECDSA P-256 PEM key; %s", path, unusable)
        return None
    try:
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            log.warning("%s was readable by others; setting mode 0600", path)
            path.chmod(0o600)
    except OSError as exc:
        raise JoinFailed("file_error", f"cannot restrict {path} to mode 0600: {exc}") from None
    return key


def _node_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """The existing P-256 key at ``path`` (a re-join keeps it), else a new one written there."""
    existing = _read_node_key(path, "generating a new node key")
    if existing is not None:
        return existing
    key = ec.generate_private_key(ec.SECP256R1())
    try:
        write_atomic(path, _key_pem(key))
    except OSError as exc:
        raise JoinFailed("file_error", f"cannot write {path}: {exc}") from None
    return key


def _csr(key: ec.EllipticCurvePrivateKey, node_name: str) -> x509.CertificateSigningRequest:
    # Kubelet client CSR rules: exactly O=system:nodes and CN=system:node:<name>, no SANs.
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}"),
        ]
    )
    return x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())


# -- checking and writing the result ------------------------------------------------------------


def _bad(detail: str, where: str = "/v1/join/finish") -> JoinFailed:
    return JoinFailed("bad_response", f"{where}: {detail}")


def _same_key(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> bool:
    return hmac.compare_digest(_spki(cert.public_key()), _spki(key.public_key()))


def _check_svid(fin: _FinishResponse, key: ec.EllipticCurvePrivateKey, where: str) -> list[x509.Certificate]:
    """The SVID certifies the node key and chains to the returned bundle; returns the roots."""
    try:
        chain = x509.load_pem_x509_certificates(fin.svid.encode("utf-8"))
        roots = x509.load_pem_x509_certificates(fin.bundle.encode("utf-8"))
    except ValueError:
        raise _bad("svid or bundle is not PEM certificates", where) from None
    leaf = chain[0]
    if not _same_key(leaf, key):
        raise _bad("the SVID certifies another key than this node's key", where)
    try:
        sid = svidlib.parse_spiffe_id(fin.spiffe_id)
        # Judge the chain at a moment inside the leaf's validity: a freshly booted node's clock
        # may be far off, and freshness is the server's business; the signature chain is ours.
        now = min(max(datetime.now(UTC), leaf.not_valid_before_utc), leaf.not_valid_after_utc)
        got = svidlib.verify_svid(leaf, roots=roots, trust_domain=sid.trust_domain, now=now, usage="client")
    except svidlib.SpiffeIdError as exc:
        raise _bad(f"spiffe_id is invalid: {exc}", where) from None
    except AttestationError as exc:
        raise _bad(f"the SVID does not verify against the returned bundle: {exc.detail}", where) from None
    if got != sid:
        raise _bad(f"the SVID names {got}, the answer says {sid}", where)
    return roots


def _kubeconfig_with_key(text: str, key: ec.EllipticCurvePrivateKey) -> bytes:
    """The server's kubeconfig has the client certificate only; the key never left the node."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        raise _bad("kubeconfig is not YAML") from None
    users = doc.get("users") if isinstance(doc, dict) else None
    if not isinstance(users, list) or not users or not isinstance(users[0], dict):
        raise _bad("kubeconfig has no users")
    user = users[0].get("user")
    if not isinstance(user, dict):
        raise _bad("kubeconfig users[0] has no user")
    cert_data = user.get("client-certificate-data")
    if cert_data is not None:
        try:
            cert = x509.load_pem_x509_certificates(_b64(cert_data))[0]
        except ValueError:
            raise _bad("kubeconfig client-certificate-data is not a base64 PEM certificate") from None
        if not hmac.compare_digest(_spki(cert.public_key()), _spki(key.public_key())):
            raise _bad("the kubelet client certificate certifies another key than this node's key")
    user["client-key-data"] = _b64e(_key_pem(key))
    return yaml.safe_dump(doc, sort_keys=False).encode("utf-8")


def _checked_credentials(
    fin: _FinishResponse, key: ec.EllipticCurvePrivateKey, node_name: str, where: str
) -> dict[str, bytes]:
    """svid.pem and bundle.pem from an answer that names this node and certifies ``key``."""
    if fin.node_name != node_name:
        raise _bad(f"answer is for node {_one_line(fin.node_name, 80)!r}, not {node_name!r}", where)
    try:
        expires = datetime.fromisoformat(fin.svid_expires_at)
    except ValueError:
        raise _bad("svid_expires_at is not an RFC 3339 timestamp", where) from None
    if expires.tzinfo is None:
        raise _bad("svid_expires_at has no time zone", where)
    roots = _check_svid(fin, key, where)
    return {SVID_FILE: fin.svid.encode("utf-8"), BUNDLE_FILE: svidlib.bundle_pem(roots)}


def _index(fin: _FinishResponse) -> bytes:
    index = {"node_name": fin.node_name, "spiffe_id": fin.spiffe_id, "svid_expires_at": fin.svid_expires_at}
    return (json.dumps(index, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _prepare_outputs(
    fin: _FinishResponse, key: ec.EllipticCurvePrivateKey, node_name: str
) -> dict[str, bytes]:
    files = _checked_credentials(fin, key, node_name, "/v1/join/finish")
    if fin.kubeconfig is not None:
        files[KUBECONFIG_FILE] = _kubeconfig_with_key(fin.kubeconfig, key)
    # Last: join.json names a complete set, so its presence means the others are from this join.
    files[INDEX_FILE] = _index(fin)
    return files


def _write_files(folder: Path, files: Mapping[str, bytes]) -> dict[str, Path]:
    """Each file atomically (0600), in the order given."""
    written: dict[str, Path] = {}
    for name, data in files.items():
        try:
            write_atomic(folder / name, data)
        except OSError as exc:
            raise JoinFailed("file_error", f"cannot write {folder / name}: {exc}") from None
        written[name] = folder / name
    return written


@contextlib.asynccontextmanager
async def _locked(folder: Path) -> AsyncIterator[None]:
    """One join or renewal at a time per folder (a flock on the folder itself, so no lock file):
    the node key and its SVID are replaced as a pair, and a second writer would tear it."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise JoinFailed("file_error", f"cannot open {folder}: {exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("waiting for another nodegate join or renew to finish with %s", folder)
            await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# -- the protocol -------------------------------------------------------------------------------


async def _quote_evidence(
    tpm: _Tpm, session: str, nonce: bytes, selection: str, csr_der: bytes
) -> dict[str, Any]:
    """The finish body's quote part: the AK quotes ``selection`` over SHA256(nonce || SHA256(csr))."""
    qualifying_data = hashlib.sha256(nonce + hashlib.sha256(csr_der).digest()).digest()
    quote, signature, pcrs = await tpm.quote(selection, qualifying_data)
    return {
        "session": session,
        "quote": _b64e(quote),
        "signature": _b64e(signature),
        "pcrs": {bank: {str(i): v.hex() for i, v in sorted(values.items())} for bank, values in pcrs.items()},
        "event_log": None,
    }


async def _finish(http: _Http, path: str, body: dict[str, Any]) -> _FinishResponse:
    try:
        return await http.post(path, body, _FinishResponse)
    except JoinFailed as exc:
        if exc.code in _RESTART_CODES:
            # The server restarted with a new session key, or the session outlived its 60 s.
            raise _Transient(exc.code, f"{path}: {exc.detail}", exc.status, restart_now=True) from None
        raise


async def _with_retries(
    attempt: Callable[[], Awaitable[T]],
    *,
    what: str,
    attempts: int,
    backoff: float,
    sleep: Callable[[float], Awaitable[None]],
    rng: random.Random,
    logger: logging.Logger,
) -> T:
    """Run ``attempt`` until it succeeds, a final JoinFailed, or ``attempts`` transient failures
    (then JoinGaveUp with the last one)."""
    failures = 0
    while True:
        try:
            return await attempt()
        except _Transient as exc:
            failures += 1
            if failures >= attempts:
                suffix = f" (after {failures} attempts)"
                raise JoinGaveUp(
                    exc.code, _one_line(exc.detail, _DETAIL_LIMIT - len(suffix)) + suffix, exc.status
                ) from None
            if exc.restart_now:
                logger.warning(
                    "%s: %s; starting a new session (attempt %d/%d)", what, exc.detail, failures + 1, attempts
                )
                continue
            delay = _delay(failures, backoff, rng, exc.retry_after)
            logger.warning(
                "%s: %s; retrying in %.1f s (attempt %d/%d)", what, exc.detail, delay, failures + 1, attempts
            )
            await sleep(delay)


def _http_session(ssl_ctx: ssl.SSLContext | bool, timeout: float, user_agent: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout),
        connector=aiohttp.TCPConnector(ssl=ssl_ctx),
        headers={"User-Agent": user_agent},
    )


async def _attempt(
    http: _Http, tpm: _Tpm, opts: JoinOptions, csr: x509.CertificateSigningRequest, csr_der: bytes
) -> _FinishResponse:
    """One pass /start -> TPM -> /finish."""
    _, ak = tpm.require()
    ek = tpm.require_ek()
    start_body: dict[str, Any] = {
        "node_name": opts.node_name,
        "ek_public": _b64e(ek.public),
        "ek_certificate": None if ek.certificate is None else _b64e(ek.certificate),
        "ak_public": _b64e(ak.public),
        "csr": csr.public_bytes(serialization.Encoding.PEM).decode("ascii"),
    }
    start = await http.post("/v1/join/start", start_body, _StartResponse)
    secret = await tpm.activate(start.credential_blob, start.encrypted_secret)
    proof = hmac.digest(secret, start.session.encode("utf-8"), "sha256")
    del secret
    body = await _quote_evidence(tpm, start.session, start.nonce, start.pcr_selection, csr_der)
    body["proof"] = _b64e(proof)
    return await _finish(http, "/v1/join/finish", body)


async def join(
    opts: JoinOptions,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rng: random.Random | None = None,
) -> JoinResult:
    """Attest this node to the join server and write its credentials under ``opts.out``."""
    rng = rng if rng is not None else random.SystemRandom()
    base = _base_url(opts.server)
    # Plain http (loopback dev server only, checked by _base_url) never negotiates TLS.
    ssl_ctx: ssl.SSLContext | bool = _ssl_context(opts.ca_bundle) if base.startswith("https:") else True
    try:
        out = ensure_dir(opts.out)
    except OSError as exc:
        raise JoinFailed("file_error", f"cannot create {opts.out}: {exc}") from None
    async with _locked(out):
        key = _node_key(out / KEY_FILE)
        csr = _csr(key, opts.node_name)
        csr_der = csr.public_bytes(serialization.Encoding.DER)
        ek_kind: agent.EkKind = "ecc" if opts.ek_kind == "ecc" else "rsa"
        async with (
            _Tpm(opts.tcti, ek_kind) as tpm,
            _http_session(ssl_ctx, opts.timeout, "nodegate-join") as s,
        ):
            http = _Http(s, base, opts.ca_bundle)
            fin = await _with_retries(
                lambda: _attempt(http, tpm, opts, csr, csr_der),
                what="join",
                attempts=opts.attempts,
                backoff=opts.backoff,
                sleep=sleep,
                rng=rng,
                logger=log,
            )
        files = _prepare_outputs(fin, key, opts.node_name)
        written = {KEY_FILE: out / KEY_FILE} | _write_files(out, files)
    return JoinResult(fin.node_name, fin.spiffe_id, fin.svid_expires_at, written)


def _delay(failures: int, backoff: float, rng: random.Random, retry_after: float | None) -> float:
    """Full jitter: uniform in [0, min(cap, backoff * 2^(n-1))]; a server's Retry-After wins, capped."""
    if retry_after is not None:
        return min(BACKOFF_CAP, retry_after)
    ceiling = min(BACKOFF_CAP, backoff * 2.0 ** min(failures - 1, 32))
    return rng.uniform(0.0, ceiling)


# -- command line -------------------------------------------------------------------------------


def add_common_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """--server, --ca-bundle, --tcti, --attempts: the same for join and renew."""
    p.add_argument("--server", required=True, help=f"{what} server URL, https://host:port")
    p.add_argument(
        "--ca-bundle",
        required=True,
        type=Path,
        metavar="FILE",
        help="PEM roots to trust for the server's TLS",
    )
    p.add_argument("--tcti", default=DEFAULT_TCTI, help=f"TPM to use (default {DEFAULT_TCTI})")
    p.add_argument(
        "--attempts",
        type=int,
        default=JoinOptions.attempts,
        help=f"total tries for transient failures (default {JoinOptions.attempts}); then exit 75",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p, "join")
    p.add_argument("--node-name", required=True, help="this node's Kubernetes name")
    p.add_argument(
        "--out",
        type=Path,
        default=JoinOptions.out,
        metavar="DIR",
        help=f"where the node key and credentials go (default {JoinOptions.out})",
    )
    p.add_argument("--ek", choices=("ecc", "rsa"), default="rsa", help="EK type to use (default rsa)")


def main(args: argparse.Namespace) -> int:
    """`nodegate join`; exit 0, 1 (refused), 2 (usage or local), 75 (transient, try later)."""
    try:
        opts = JoinOptions(
            server=args.server,
            ca_bundle=args.ca_bundle,
            node_name=args.node_name,
            tcti=args.tcti,
            out=args.out,
            ek_kind=args.ek,
            attempts=args.attempts,
        )
        result = asyncio.run(join(opts))
    except (JoinUsageError, JoinFailed) as exc:
        return report_failure("nodegate join", exc)
    print(f"joined as {result.spiffe_id} (SVID valid until {result.svid_expires_at})")
    for name, path in result.files.items():
        print(f"  {name}: {path}")
    return EXIT_OK
