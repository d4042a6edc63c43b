"""HTTP plumbing, no flow logic: the guarded listener, the body reader, the one problem+json
middleware, JSON inputs, client certificates and rate limits. Knows the running service only as
``plumbing.Plumbing`` (settings and metrics), never ``bootstrap.service.state``."""
