"""Upstream-derived admission cases: NodeWright's (and the older Skyhook repository's) own webhook
unit tests, chainsaw e2e steps, samples and documentation CRs, rebuilt here as Python builders of
the objects, each with its provenance (repository, commit, path, item) and upstream's verdict.

Nothing is copied from upstream: the objects are written out again from reading it, and turned
into AdmissionReviews as the API server would hand them to a validating webhook (after the CRD
schema: unknown fields pruned, defaults filled). :mod:`corpus` collects them all.
"""
