"""`nodegate serve --config FILE`: the YAML configuration, every key with a default.

The keys are listed in docs/config.md; the few additions (``spiffe_id_template``, ``server_names``,
``ca_grace``, ``limits``, ``admin``) are documented in docs/operations.md. Unknown keys are an
error: a typo in a security setting must not silently fall back to a default. Relative paths are
resolved against the config file's folder.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from attest import yamlsafe
from attest.measuredboot.policy import MeasuredBootPolicy
from attest.pcr import PcrPolicy
from bootstrap.names import is_node_name

MAX_CONFIG_BYTES = 1024 * 1024
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?")
_HEX64 = re.compile(r"[0-9a-f]{64}")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems or (message,)  # one line per problem (nodegate config validate)


def parse_duration(value: object) -> timedelta:
    """``90s``, ``1h30m``, ``500ms``, ``2d``, or a number of seconds."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or text such as 60s, 1h, 1h30m")  # noqa: TRY004 (pydantic)
    try:
        if isinstance(value, int | float):
            seconds = float(value)
        elif isinstance(value, str):
            m = _DURATION.fullmatch(value.strip())
            if not value.strip() or m is None or not any(m.groups()):
                raise ValueError(f"{value!r} is not a duration such as 60s, 1h, 1h30m")
            d, h, mi, s, ms = (int(g) if g else 0 for g in m.groups())
            seconds = d * 86400 + h * 3600 + mi * 60 + s + ms / 1000
        else:
            raise ValueError("a duration is a number of seconds or text such as 60s, 1h, 1h30m")  # noqa: TRY004 (pydantic)
        if not seconds > 0:  # also NaN
            raise ValueError("a duration must be positive")
        duration = timedelta(seconds=seconds)
    except OverflowError:  # .inf, 1e400, 99999999999d; pydantic reports only ValueError cleanly
        raise ValueError("the duration is too long") from None
    if not duration:  # below a microsecond rounds to zero
        raise ValueError("a duration must be positive")
    return duration


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


def parse_window(value: object) -> timedelta:
    """A duration that may also be zero (``0``, ``0s``): a stability window can be switched off."""
    if not isinstance(value, bool) and (
        value == 0 or (isinstance(value, str) and value.strip() in ("0", "0s"))
    ):
        return timedelta(0)
    return parse_duration(value)


Window = Annotated[timedelta, BeforeValidator(parse_window)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsFiles(_Model):
    cert_file: Path | None = None
    key_file: Path | None = None


class InventoryEntry(_Model):
    ek_sha256: str
    node_name: str
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("ek_sha256")
    @classmethod
    def _hex(cls, v: str) -> str:
        v = v.lower()
        if not _HEX64.fullmatch(v):
            raise ValueError("ek_sha256 must be 64 hex characters (SHA-256 of the EK SubjectPublicKeyInfo)")
        return v

    @field_validator("node_name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not is_node_name(v):
            raise ValueError(f"{v!r} is not a Kubernetes node name")
        return v


class KubernetesSettings(_Model):
    kubeconfig: Path | None = None
    timeout: Duration = timedelta(seconds=5)
    csr_timeout: Duration = timedelta(seconds=20)  # waiting for the signer to issue the kubelet cert
    events_namespace: str = "default"
    # nodegate's own namespace (an addition to the core keys): the kubernetes store's EK claims (Leases).
    namespace: str = "nodegate"
    # The API server as the nodes reach it, for their kubelet kubeconfig (additions). Unset: the
    # address nodegate itself uses, which in a pod is a ClusterIP that a joining node cannot reach.
    kubelet_api_server: str | None = None
    kubelet_api_ca_file: Path | None = None

    @field_validator("kubelet_api_server")
    @classmethod
    def _https(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("https://") or len(v) > 512 or any(c.isspace() for c in v)):
            raise ValueError("kubelet_api_server must be an https:// URL")
        return v


class GateSettings(_Model):
    taint_key: str = "nodegate.io/hold"
    # Additions to the core keys (docs/gate.md): run the gate inside `nodegate serve` when a cluster is
    # configured (False: run `nodegate gate` as its own Deployment instead).
    enabled: bool = True
    stability_window: Window = timedelta(seconds=30)
    # Re-attestation, quarantine effect, resync, leader lease: additions too.
    attestation_lifetime: Duration | None = None  # older attestations are quarantined; None: expiresAt only
    quarantine_effect: Literal["NoSchedule", "NoExecute"] = "NoSchedule"
    resync: Duration = timedelta(minutes=10)
    lease_namespace: str = "nodegate"
    lease_name: str = "nodegate-gate"
    lease_duration: Duration = timedelta(seconds=15)


class AdmissionSettings(_Model):
    policy_files: tuple[Path, ...] | None = None
    rbac_files: tuple[Path, ...] | None = None
    # nodegate's own username: the only one allowed to lift the hold taint (an addition to the core keys)
    owner: str = "system:serviceaccount:nodegate:nodegate"
    # The webhooks' own listener (API server only), apart from the join API: a flood of reviews
    # cannot take the join listener's connections or slots (docs/config.md).
    listen: str = "0.0.0.0:9443"
    # Reviews worked on at once, per route (/admission/validate, /admission/mutate); more wait for
    # a slot, briefly (an addition to the core keys, docs/config.md).
    max_inflight: int = Field(default=32, ge=1, le=1024)
    # The audit line of each allowed review (who was allowed what) at info, or at debug to keep it
    # out of an info log; denials are always logged at info (an addition, docs/admission.md).
    log_allowed: Literal["info", "debug"] = "info"

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host_port(v)
        return v


class NodeWrightSettings(_Model):
    # POST /admission/mutate adds the package-hold tolerations to NodeWright and Skyhook CRs, so
    # NodeWright's operator reaches held nodes (docs/admission.md). Off: the validating webhook warns.
    inject_tolerations: bool = True


class Limits(_Model):
    max_body_bytes: int = Field(default=64 * 1024, ge=1024, le=64 * 1024)  # the protocol's cap
    join_rate: float = Field(default=50.0, gt=0)  # requests per second per client address
    join_burst: int = Field(default=200, ge=1)
    max_inflight: int = Field(default=256, ge=1)  # join requests being worked on at once


AdminPermission = Literal["list", "revoke", "rotate", "metrics", "forget"]


class AdminSettings(_Model):
    # SPIFFE IDs of admin SVIDs (mTLS) and what each may do; bearer tokens go through
    # TokenReview + SubjectAccessReview instead.
    spiffe_ids: dict[str, tuple[AdminPermission, ...]] = Field(default_factory=dict)


class Settings(_Model):
    trust_domain: str = "example.org"
    listen: str = "0.0.0.0:8443"
    tls: TlsFiles = TlsFiles()
    state_dir: Path = Path("/var/lib/nodegate")
    store: Literal["sqlite", "kubernetes"] = "sqlite"
    ek_roots: tuple[Path, ...] = ()
    ek_allowlist: tuple[str, ...] = ()
    ek_denylist: tuple[str, ...] = ()
    enrollment: Literal["tofu", "inventory"] = "tofu"
    inventory: tuple[InventoryEntry, ...] = ()
    pcr_policy: PcrPolicy = PcrPolicy()
    # Empty: the event log is replayed, checked against the quote and recorded; nothing enforced.
    measured_boot: MeasuredBootPolicy = MeasuredBootPolicy()
    spiffe_id_template: str = "spiffe://{trust_domain}/node/{node_name}"
    svid_ttl: Duration = timedelta(hours=1)
    session_ttl: Duration = timedelta(seconds=60)
    ca_grace: Duration = timedelta(hours=24)
    # Empty: this host's name and addresses, and loopback (bootstrap/service/hostnames.py).
    server_names: tuple[str, ...] = ()
    kubernetes: KubernetesSettings = KubernetesSettings()
    gate: GateSettings = GateSettings()
    admission: AdmissionSettings = AdmissionSettings()
    nodewright: NodeWrightSettings = NodeWrightSettings()
    limits: Limits = Limits()
    admin: AdminSettings = AdminSettings()

    @field_validator("ek_allowlist", "ek_denylist")
    @classmethod
    def _hexes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        out = tuple(x.lower() for x in v)
        for x in out:
            if not _HEX64.fullmatch(x):
                raise ValueError(f"{x!r} is not a 64-character hex SHA-256")
        return out

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host_port(v)
        return v

    @model_validator(mode="after")
    def _two_listeners(self) -> Settings:
        (host, port), (adm_host, adm_port) = host_port(self.listen), host_port(self.admission.listen)
        wildcard = {"0.0.0.0", "::"}  # noqa: S104  (comparing, not binding)
        if port == adm_port != 0 and (host == adm_host or host in wildcard or adm_host in wildcard):
            raise ValueError(
                f"admission.listen ({self.admission.listen}) must not be the join listener's port"
            )
        return self

    @field_validator("session_ttl")
    @classmethod
    def _session_ttl(cls, v: timedelta) -> timedelta:
        if v > timedelta(minutes=10):
            raise ValueError("session_ttl above 10m keeps credential challenges alive too long")
        return v

    @model_validator(mode="after")
    def _measured_boot_pcrs(self) -> Settings:
        missing = self.measured_boot.missing_pcrs(self.pcr_policy.pcrs)
        if missing:
            raise ValueError(
                f"measured_boot: {missing} (pcr_policy.pcrs; a PCR outside the quote proves nothing)"
            )
        return self

    @property
    def inventory_index(self) -> dict[str, InventoryEntry]:
        return {e.ek_sha256: e for e in self.inventory}


def host_port(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen must be HOST:PORT, got {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104  (the documented default)


def _resolve(base: Path, data: dict[str, Any]) -> dict[str, Any]:
    def fix(p: object) -> object:
        return str(base / p) if isinstance(p, str) and not Path(p).is_absolute() else p

    out = dict(data)
    for key in ("state_dir",):
        if key in out:
            out[key] = fix(out[key])
    if isinstance(out.get("ek_roots"), list):  # "vendors" names the vendor root store, not a path
        out["ek_roots"] = [p if p == "vendors" else fix(p) for p in out["ek_roots"]]
    for section, keys in (
        ("tls", ("cert_file", "key_file")),
        ("kubernetes", ("kubeconfig",)),
        ("admission", ("policy_files", "rbac_files")),
    ):
        sub = out.get(section)
        if isinstance(sub, dict):
            sub = dict(sub)
            for k in keys:
                if isinstance(sub.get(k), list):
                    sub[k] = [fix(p) for p in sub[k]]
                elif k in sub:
                    sub[k] = fix(sub[k])
            out[section] = sub
    return out


def settings_from_obj(data: object, base: Path | None = None) -> Settings:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("the config must be a YAML mapping")
    if base is not None:
        data = _resolve(base, data)
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        lines = [f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("invalid config: " + "; ".join(lines), tuple(lines)) from None


def load_settings(path: Path) -> Settings:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # never more than the cap into memory
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config {path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        data = yamlsafe.load(raw)
    except RecursionError:  # deeply nested flow collections exhaust the composer's stack
        raise ConfigError(f"config {path} is nested too deeply") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
    return settings_from_obj(data, path.parent)
