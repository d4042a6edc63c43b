"""Cloud vTPM CAs vouch for every VM of their cloud, not for a machine you own (issue 33, finding
1): an EK chain through one needs a binding of its own (docs/ek-roots.md, "Cloud vTPMs").

A chain is a cloud chain when its EK certificate carries GCE's instance identity, or any of its
certificates is a known cloud vTPM CA (:data:`KNOWN_CLOUD_CAS`, SHA-256 of the DER, facts) or one
the operator marked when importing it. For GCE the binding is the project (id or number) or the
instance id that the EK certificate names, against the configured allowlists; other clouds have
no per-VM identity in their EK certificates that nodegate reads, so their chains are refused
(allowlist those EKs). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from attest import gceidentity
from attest.certparse import Cert
from attest.errors import EkUntrusted

GCE = "gce"
ALIBABA = "alibaba"

# Published cloud vTPM CAs (SHA-256 of the certificate DER). Google's from go-tpm-tools'
# server/ca-certs (the roots also at the URLs docs/ek-roots.md names); Alibaba's intermediate
# from keylime's tpm_cert_store.
KNOWN_CLOUD_CAS: Mapping[str, str] = {
    # EK/AK CA Root (Google Cloud)
    "594759594b9b61524f6c8ef668f7177f7b9066bc0674f2f49fe9e052be78beb2": GCE,
    # EK/AK CA Intermediate (Google Cloud)
    "c84de8116dfaf5a908f21e810487791f5437e206d00ad8025050cca6bd2ff627": GCE,
    # tpm_ek_v1_cloud_host_root-signer-0-2018-04-06T10:58:26-07:00
    "9bd5285f8fb18502a7947e621ffd470266f49fcd3b73e19a190f690ad32a7caf": GCE,
    # tpm_ek_v1_cloud_host-signer-0-2020-10-22T14:02:08-07:00
    "5d8dbcf8c8053dd8ffad711b6219355032b7122c34cac0f90ccb49def69ec504": GCE,
    # tpm_ek_v1_cloud_host-signer-0-2021-10-12T04:22:11-07:00
    "7132b6ea71101f6c51bb58f98c3798c19b65be510eca0344318900510b593178": GCE,
    # Aliyun TPM EKMF CA (Alibaba Cloud vTPM)
    "141805f04cd9b89bfbcd30cb792d5ca3a0a2382db6ee35720e6e27e4189e43a0": ALIBABA,
}
PROVIDERS = frozenset({GCE, ALIBABA})


@dataclass(frozen=True, slots=True)
class CloudBindings:
    """What a cloud chain must name to be accepted (config ``ek_cloud``). Empty: none accepted."""

    gce_projects: frozenset[str] = frozenset()  # project ids or project numbers (decimal)
    gce_instances: frozenset[str] = frozenset()  # instance ids (decimal)
    # Further CAs to treat as cloud vTPM CAs: SHA-256 of the DER -> provider (imported, marked).
    marked: Mapping[str, str] = field(default_factory=dict)

    def provider_of(self, sha256: str) -> str | None:
        return KNOWN_CLOUD_CAS.get(sha256) or self.marked.get(sha256)

    def binds(self, provider: str) -> bool:
        return provider == GCE and bool(self.gce_projects or self.gce_instances)


NO_BINDINGS = CloudBindings()


def cloud_provider(chain: Sequence[Cert], bindings: CloudBindings = NO_BINDINGS) -> str | None:
    """Which cloud vouches for this chain (leaf first), or None for a TPM maker's chain."""
    if chain and gceidentity.has_instance_info(chain[0]):
        return GCE
    for cert in chain:
        provider = bindings.provider_of(cert.sha256)
        if provider is not None:
            return provider
    return None


def check_binding(chain: Sequence[Cert], bindings: CloudBindings) -> str:
    """ "" for a TPM maker's chain; for a cloud chain, what binds it (``gce project P instance I``),
    or EkUntrusted: a cloud CA alone says only "some VM of this cloud"."""
    provider = cloud_provider(chain, bindings)
    if provider is None:
        return ""
    if provider != GCE:
        raise EkUntrusted(
            f"the EK certificate chains to a {provider} cloud vTPM CA, which vouches for every VM of "
            "that cloud; nodegate reads no per-VM identity from it: allowlist these EKs (ek_allowlist)"
        )
    instance = gceidentity.instance_of(chain[0])
    who = f"GCE instance {instance.instance_id} ({instance.instance_name}) of project {instance.project_id}"
    if not bindings.binds(GCE):
        raise EkUntrusted(
            f"{who}: its EK chains to Google's vTPM CA, which certifies every GCE VM of every "
            "project; configure ek_cloud.gce.projects (or instances) to accept your own"
        )
    if not instance.is_production:
        raise EkUntrusted(f"{who}: its EK certificate is not marked production (isProduction)")
    named = {instance.project_id, str(instance.project_number)}
    if named & bindings.gce_projects or str(instance.instance_id) in bindings.gce_instances:
        return f"gce project {instance.project_id} instance {instance.instance_id}"
    raise EkUntrusted(f"{who} is not in ek_cloud.gce.projects or ek_cloud.gce.instances")
