"""Logs: structured JSON lines and their set-up (``setup``), the batch writer (``batch``) and
the admission webhook's line per review (``audit``)."""
