"""Where the API server is and how to authenticate: a kubeconfig file, or the pod's service account."""

from __future__ import annotations

import os

import yaml
from kubernetes_asyncio import client as kc
from kubernetes_asyncio import config as kconfig

from attest import yamlsafe
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


def check_kubeconfig_file(path: str | os.PathLike[str]) -> None:
    """The one message for a kubeconfig that is not there or cannot be read (``serve``, ``gate``,
    ``config validate``, ``kubectl nodegate``): KubeConfigError ``kubeconfig PATH does not exist``."""
    try:
        with open(path, "rb"):
            pass
    except FileNotFoundError:
        raise KubeConfigError(f"kubeconfig {path} does not exist") from None
    except IsADirectoryError:
        raise KubeConfigError(f"kubeconfig {path} is a folder, not a file") from None
    except OSError as exc:
        raise KubeConfigError(f"kubeconfig {path} cannot be read: {exc.strerror or exc}") from None


def _library_words(path: str, exc: Exception) -> str:
    """kubernetes_asyncio's exceptions in our words where we know them; else its text, one line."""
    text = " ".join(str(exc).split())
    if "Expected key current-context" in text:
        return (
            f"kubeconfig {path} names no current-context: pass --context, or set one "
            "(kubectl config use-context)"
        )
    lacks = ("Expected key contexts", "Expected key clusters", "Expected key users")
    if isinstance(exc, TypeError | AttributeError | KeyError) or any(x in text for x in lacks):
        return f"kubeconfig {path} is not a kubeconfig (a mapping with clusters, contexts and users)"
    return f"kubeconfig {path}: {text}"[:300]


async def load_configuration(kubeconfig: str | None, context: str | None = None) -> kc.Configuration | None:
    """A kubeconfig file when one is named; else the pod's service account when running in a
    cluster; else None (no cluster). Async because kubernetes_asyncio loads kubeconfigs
    asynchronously (exec and OIDC credential plugins). Always a fresh Configuration: the
    library's global default is never touched. A file that cannot be used raises
    KubeConfigError."""
    cfg = kc.Configuration()
    if kubeconfig is not None:
        check_kubeconfig_file(kubeconfig)  # before the library, which logs "Config not found" and goes on
        try:
            await kconfig.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=cfg, persist_config=False
            )
        except (kconfig.ConfigException, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KubeConfigError(_library_words(kubeconfig, exc)) from None
        except yaml.YAMLError as exc:
            raise KubeConfigError(
                f"kubeconfig {kubeconfig} is not valid YAML: {yamlsafe.describe(exc)}"
            ) from None
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
