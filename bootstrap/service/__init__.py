"""The nodegate service: join and renewal API, admin API, admission webhook, serving.

Rooms (docs/architecture.md): ``http`` (plumbing), ``pki`` (CA/TLS lifecycle), the flows ``join``,
``admin`` and ``webhook``, ``routes`` on the running ``state.Service``; serving at the top."""
