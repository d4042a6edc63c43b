"""Shared test helpers, one module each: software TPMs and forged TPM structures (``softtpm``,
``fakes``), simulated nodes (``softnode``), the in-process service (``service``), the emulated
Kubernetes API (``kshim``), swtpm fixture types (``swtpms``) and throwaway certificates (``certs``)."""
