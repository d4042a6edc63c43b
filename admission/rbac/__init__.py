"""Kubernetes RBAC evaluated locally: manifests read as the API server reads them
(``manifests``), the objects (``objects``) and the evaluator (``evaluator``)."""
