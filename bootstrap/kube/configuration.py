"""Where the API server is and how to authenticate: a kubeconfig file, or the pod's service account."""

from __future__ import annotations

import os

import yaml
from kubernetes_asyncio import client as kc
from kubernetes_asyncio import config as kconfig

from bootstrap.kube.errors import KubeConfigError

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105  (a path)
SERVICE_ACCOUNT_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
_CA_LIMIT = 1 << 20


def read_ca_bundle(path: str | os.PathLike[str], what: str) -> bytes:
    """A PEM CA bundle for a kubeconfig (at most 1 MiB); KubeConfigError names ``what``."""
    try:
        with open(path, "rb") as f:
            pem = f.read(_CA_LIMIT + 1)
    except OSError as exc:
        raise KubeConfigError(f"{what} {path}: {exc.strerror}") from None
    if len(pem) > _CA_LIMIT or b"-----BEGIN CERTIFICATE-----" not in pem:
        raise KubeConfigError(f"{what} {path}: not a PEM certificate bundle")
    return pem


async def load_configuration(kubeconfig: str | None, context: str | None = None) -> kc.Configuration | None:
    """A kubeconfig file when one is named; else the pod's service account when running in a
    cluster; else None (no cluster). Async because kubernetes_asyncio loads kubeconfigs
    asynchronously (exec and OIDC credential plugins). Always a fresh Configuration: the
    library's global default is never touched. A file that cannot be used raises
    KubeConfigError."""
    cfg = kc.Configuration()
    if kubeconfig is not None:
        try:
            await kconfig.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=cfg, persist_config=False
            )
        except (kconfig.ConfigException, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KubeConfigError(f"kubeconfig {kubeconfig}: {type(exc).__name__}: {exc}"[:300]) from None
        except yaml.YAMLError as exc:
            raise KubeConfigError(f"kubeconfig {kubeconfig}: not YAML: {exc}"[:300]) from None
    elif os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.isfile(SERVICE_ACCOUNT_TOKEN):
        try:
            kconfig.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=cfg,
                token_filename=SERVICE_ACCOUNT_TOKEN,
                cert_filename=SERVICE_ACCOUNT_CA,
            )
        except (kconfig.ConfigException, OSError) as exc:
            raise KubeConfigError(f"in-cluster config: {exc}"[:300]) from None
    else:
        return None
    cfg.host = str(cfg.host).rstrip("/")
    return cfg
