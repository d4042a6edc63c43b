"""`nodegate serve --config FILE`: the YAML configuration, every key with a default.

The keys are listed in docs/config.md; the few additions (``spiffe_id_template``, ``server_names``,
``ca_grace``, ``limits``, ``admin``) are documented in docs/operations.md. Unknown keys are an
error: a typo in a security setting must not silently fall back to a default. Relative paths are
resolved against the config file's folder.
"""

from __future__ import annotations

import ipaddress
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
    IPvAnyNetwork,
    ValidationError,
    field_validator,
    model_validator,
)

from admission.hold.removals import DEFAULT_OPERATORS
from attest import validation, yamlsafe
from attest.measuredboot.policy import MeasuredBootPolicy
from attest.pcr import PcrPolicy
from attest.spiffeid import SpiffeIdError, render_spiffe_id, validate_trust_domain
from attest.x509pop import is_fact_value
from bootstrap.cloudconfig import EkCloud
from bootstrap.diskconfig import DiskKeysSettings, check_disk_keys
from bootstrap.names import is_node_name

MAX_CONFIG_BYTES = 1024 * 1024
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?")
_HEX64 = re.compile(r"[0-9a-f]{64}")
SPIRE_AGENT_PREFIX = "spiffe://{trust_domain}/spire/agent/"
SPIRE_ATTESTATION = "{attestation}"  # the agent ID's placeholder for the x509pop attestation fact
POOL_LABEL = "nodegate.io/pool"  # the inventory label that names a node's pool


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems or (message,)  # one line per problem (nodegate config validate)


def parse_duration(value: object) -> timedelta:
    """``90s``, ``1h30m``, ``500ms``, ``2d``. A bare number is refused: ``svid_ttl: 5`` reads as
    five hours to some and five seconds to others, so the unit is always written."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError("a duration is text such as 60s, 1h, 1h30m")  # noqa: TRY004 (pydantic)
    if isinstance(value, int | float):
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        raise ValueError(  # noqa: TRY004 (pydantic reports only ValueError cleanly)
            f"the duration {shown} has no unit: write {shown}s (seconds), {shown}m or {shown}h"
        )
    try:
        if isinstance(value, str):
            m = _DURATION.fullmatch(value.strip())
            if value.strip().isdigit():
                n = value.strip()
                raise ValueError(f"the duration {n} has no unit: write {n}s (seconds), {n}m or {n}h")
            if not value.strip() or m is None or not any(m.groups()):
                raise ValueError(f"{value!r} is not a duration such as 60s, 1h, 1h30m")
            d, h, mi, s, ms = (int(g) if g else 0 for g in m.groups())
            seconds = d * 86400 + h * 3600 + mi * 60 + s + ms / 1000
        else:
            raise ValueError("a duration is text such as 60s, 1h, 1h30m")  # noqa: TRY004 (pydantic)
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

    @field_validator("labels")
    @classmethod
    def _pool(cls, v: dict[str, str]) -> dict[str, str]:
        # The pool becomes an x509pop URI SAN and a SPIRE selector (docs/spire.md).
        if POOL_LABEL in v and not is_fact_value(v[POOL_LABEL]):
            raise ValueError(f"{POOL_LABEL} must be one segment of A-Z, a-z, 0-9, '.', '-', '_'")
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


def _network_loose(value: object) -> object:
    """A CIDR with host bits set means its network, as NetworkPolicy's ipBlock takes it (the chart
    passes the same list to both)."""
    if isinstance(value, str):
        try:
            return ipaddress.ip_network(value.strip(), strict=False)
        except ValueError:
            return value  # pydantic names it invalid
    return value


SourceNetwork = Annotated[IPvAnyNetwork, BeforeValidator(_network_loose)]


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
    # The NodeWright operator's accounts: they delete package CRs and take NodeWright's finalizer
    # off without the deploy check everyone else needs (docs/admission.md; an addition).
    operator_users: tuple[str, ...] = DEFAULT_OPERATORS
    # The audit line of each allowed review (who was allowed what) at info, or at debug to keep it
    # out of an info log; denials are always logged at info (an addition, docs/admission.md).
    log_allowed: Literal["info", "debug"] = "info"
    # The API server's source addresses (the chart sets them from its NetworkPolicy's
    # webhookSourceCidrs): on the webhooks' listener they have no per-address connection cap and
    # room kept for them, so other clients cannot crowd them out (an addition, docs/config.md).
    api_server_sources: tuple[SourceNetwork, ...] = ()

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host_port(v)
        return v


class NodeWrightSettings(_Model):
    # POST /admission/mutate adds the package-hold tolerations to NodeWright and Skyhook CRs, so
    # NodeWright's operator reaches held nodes (docs/admission.md). Off: the validating webhook warns.
    inject_tolerations: bool = True


class SpireSettings(_Model):
    """SPIRE on attested nodes (docs/spire.md), an addition to the core keys."""

    # Issue the x509pop certificate (attested facts as URI SANs) with every SVID.
    x509pop: bool = False
    # SPIRE's trust domain (the x509pop SANs name it); None: nodegate's own.
    trust_domain: str | None = None
    # The SPIRE server's admin API socket (its server.socket_path, "local" callers are admins):
    # nodegate bans there the agents of nodes it does not accept now. None: no bans (docs/spire.md,
    # "Which agents may run").
    server_socket: Path | None = None
    # The agent's SPIFFE ID as SPIRE's agent_path_template makes it (placeholders trust_domain
    # = SPIRE's, node_name, ek_sha256, and attestation, which it must have: one ID per attestation,
    # so an earlier one's certificates can be banned apart from the current one's).
    agent_id_template: str = "spiffe://{trust_domain}/spire/agent/x509pop/{node_name}/{attestation}"
    # Every agent SPIRE knows is checked against the store this often: agents that attested since
    # (SPIRE bans only agents it knows), bans that failed while SPIRE was unreachable (docs/spire.md).
    ban_interval: Duration = timedelta(seconds=30)
    # Where nodegate keeps the x509pop CA bundle for SPIRE's ca_bundle_path (PEM, every root in
    # the bundle) and the plugin data file naming it, rewritten on every CA change; None: not kept.
    bundle_file: Path | None = None
    plugin_data_file: Path | None = None
    # A file with the SPIRE server's pid: sent SIGUSR1 (reload the plugin data) after a change.
    server_pid_file: Path | None = None

    @field_validator("trust_domain")
    @classmethod
    def _td(cls, v: str | None) -> str | None:
        if v is not None:
            validate_trust_domain(v)
        return v

    @field_validator("ban_interval")
    @classmethod
    def _interval(cls, v: timedelta) -> timedelta:
        if not timedelta(seconds=1) <= v <= timedelta(hours=1):
            raise ValueError("ban_interval must be between 1s and 1h")
        return v

    @model_validator(mode="after")
    def _pairs(self) -> SpireSettings:
        if (self.bundle_file is None) != (self.plugin_data_file is None):
            raise ValueError("bundle_file and plugin_data_file go together")
        if self.server_pid_file is not None and self.plugin_data_file is None:
            raise ValueError("server_pid_file needs plugin_data_file (the reload re-reads it)")
        return self


class Limits(_Model):
    max_body_bytes: int = Field(default=64 * 1024, ge=1024, le=64 * 1024)  # the protocol's cap
    join_rate: float = Field(default=50.0, gt=0)  # requests per second per client address
    join_burst: int = Field(default=200, ge=1)
    max_inflight: int = Field(default=256, ge=1)  # join requests being worked on at once
    admin_rate: float = Field(default=5.0, gt=0)  # admin requests per second per client address
    admin_burst: int = Field(default=20, ge=1)
    admin_reviews: int = Field(default=4, ge=1)  # bearer-token TokenReviews/SARs in flight at once


AdminPermission = Literal["list", "revoke", "rotate", "metrics", "forget"]


class AdminSettings(_Model):
    # SPIFFE IDs of admin SVIDs (mTLS) and what each may do; bearer tokens go through
    # TokenReview + SubjectAccessReview instead.
    spiffe_ids: dict[str, tuple[AdminPermission, ...]] = Field(default_factory=dict)


class EkAia(_Model):
    # Fetching an EK certificate's missing issuer from its AIA caIssuers URL (bootstrap/service/join/aia.py).
    enabled: bool = True
    # Off: only public addresses are fetched (no loopback, private, link-local, ... ranges).
    allow_private_addresses: bool = False
    max_fetches_per_minute: int = Field(default=30, ge=1, le=600)  # distinct URLs fetched
    # URL prefix -> replacement prefix: fetch a vendor's AIA URLs from a mirror you run.
    mirrors: dict[str, str] = Field(default_factory=dict)

    @field_validator("mirrors")
    @classmethod
    def _mirrors(cls, v: dict[str, str]) -> dict[str, str]:
        for prefix, target in v.items():
            for url in (prefix, target):
                if not url.startswith(("http://", "https://")) or len(url) > 2048:
                    raise ValueError(f"{url!r} is not an http or https URL prefix")
        return v


class Settings(_Model):
    trust_domain: str = "example.org"
    listen: str = "0.0.0.0:8443"
    tls: TlsFiles = TlsFiles()
    state_dir: Path = Path("/var/lib/nodegate")
    store: Literal["sqlite", "kubernetes"] = "sqlite"
    ek_roots: tuple[Path, ...] = ()
    ek_allowlist: tuple[str, ...] = ()
    ek_denylist: tuple[str, ...] = ()
    ek_cloud: EkCloud = EkCloud()  # bindings for cloud vTPM CAs (an addition: docs/ek-roots.md)
    ek_aia: EkAia = EkAia()  # fetching missing EK intermediates (an addition: docs/ek-roots.md)
    enrollment: Literal["tofu", "inventory"] = "tofu"
    inventory: tuple[InventoryEntry, ...] = ()
    pcr_policy: PcrPolicy = PcrPolicy()
    # Empty: the event log is replayed, checked against the quote and recorded; nothing enforced.
    measured_boot: MeasuredBootPolicy = MeasuredBootPolicy()
    spiffe_id_template: str = "spiffe://{trust_domain}/node/{node_name}"
    svid_ttl: Duration = timedelta(hours=1)
    session_ttl: Duration = timedelta(seconds=60)
    ca_grace: Duration = timedelta(hours=24)
    # Empty: this host's name and addresses, and loopback (bootstrap/service/pki/hostnames.py).
    server_names: tuple[str, ...] = ()
    kubernetes: KubernetesSettings = KubernetesSettings()
    gate: GateSettings = GateSettings()
    admission: AdmissionSettings = AdmissionSettings()
    nodewright: NodeWrightSettings = NodeWrightSettings()
    limits: Limits = Limits()
    admin: AdminSettings = AdminSettings()
    spire: SpireSettings = SpireSettings()
    disk_keys: DiskKeysSettings | None = None  # an addition (docs/disk-keys.md): off unless present

    @field_validator("trust_domain")
    @classmethod
    def _trust_domain(cls, v: str) -> str:
        # the check the CA store makes at start (serve), so `config validate` refuses the same
        return validate_trust_domain(v)

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
    def _spire_agent_id(self) -> Settings:
        if not self.spire.agent_id_template.startswith(SPIRE_AGENT_PREFIX):
            raise ValueError(f"spire.agent_id_template must start with {SPIRE_AGENT_PREFIX}")
        if self.spire.agent_id_template.count(SPIRE_ATTESTATION) != 1:
            raise ValueError(f"spire.agent_id_template must have {SPIRE_ATTESTATION} once (docs/spire.md)")
        try:
            render_spiffe_id(
                self.spire.agent_id_template.replace(SPIRE_ATTESTATION, "0" * 32),
                trust_domain=self.spire_trust_domain,
                node_name="node-1",
                ek_sha256="0" * 64,
            )
        except SpiffeIdError as exc:
            raise ValueError(f"spire.agent_id_template: {exc}") from None
        return self

    @property
    def spire_trust_domain(self) -> str:
        return self.spire.trust_domain or self.trust_domain

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
        bank = self.measured_boot.bank_problem(self.pcr_policy.bank)
        if bank:
            raise ValueError(f"measured_boot with pcr_policy.bank {self.pcr_policy.bank}: {bank}")
        return self

    @model_validator(mode="after")
    def _disk_keys_need_a_quote_policy(self) -> Settings:
        if self.disk_keys is not None:
            check_disk_keys(self.disk_keys, self.pcr_policy, self.measured_boot)
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
    # "vendors" names the vendor root store, "imported" the imported roots: not paths
    if isinstance(out.get("ek_roots"), list):
        out["ek_roots"] = [p if p in ("vendors", "imported") else fix(p) for p in out["ek_roots"]]
    for section, keys in (
        ("tls", ("cert_file", "key_file")),
        ("kubernetes", ("kubeconfig",)),
        ("admission", ("policy_files", "rbac_files")),
        ("spire", ("server_socket", "bundle_file", "plugin_data_file", "server_pid_file")),
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
        lines = validation.problems(exc, Settings)
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
        raise ConfigError(f"config {path} is not valid YAML: {yamlsafe.describe(exc)}") from None
    return settings_from_obj(data, path.parent)
