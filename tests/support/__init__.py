"""Shared test helpers, one module each, among them: software TPMs and forged TPM structures
(``softtpm``, with its parts ``softtpm_keys``, ``softtpm_ekcert``, ``softtpm_activate``,
``softtpm_errors``; ``fakes``), simulated nodes (``softnode``), the in-process service
(``service``), the admission listener for tests (``reviewserver``), the emulated Kubernetes API
(``kshim``), swtpm fixture types (``swtpms``), throwaway certificates (``certs``) and the public
test data (``shared_data``)."""
