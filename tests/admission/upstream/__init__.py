"""Upstream-derived admission cases: NodeWright's (and the older Skyhook repository's) own webhook
unit tests, chainsaw e2e steps, samples and documentation CRs, rebuilt here as Python builders of
the objects, each with its provenance (repository, commit, path, item) and upstream's verdict.

Upstream's CRs are upstream's material, not ours (issue 31): the sample and documentation CRs are
read unedited from the public test data (``shared("nodewright")``); what these modules keep are
facts (test and step names, the order of the steps, upstream's verdicts and messages) and our own
models (the API server, the operator's Go encoding, its picker and pods). The chainsaw e2e CRs and
seven documentation CRs the public test data does not hold yet are still retyped, in the places
marked PENDING SHARED DATA; ``shared_data_wanted.json`` names each file they need (repository,
commit, path, SHA-256). The objects are turned into AdmissionReviews as the API server would hand
them to a validating webhook (after the CRD schema: unknown fields pruned, defaults filled).
:mod:`corpus` collects them all.
"""
