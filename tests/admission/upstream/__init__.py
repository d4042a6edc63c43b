"""Upstream-derived admission cases: NodeWright's (and the older Skyhook repository's) own webhook
unit tests, chainsaw e2e steps, samples and documentation CRs, each as the request it causes, with
its provenance (repository, commit, path, item) and upstream's verdict.

Upstream's CRs are upstream's material, not ours (issue 31): the sample and documentation CRs are
read unedited from the public test data (``shared("nodewright")``); what these modules keep are
facts (test and step names, what a script does, upstream's verdicts and messages) and our own
models (the API server, the operator's Go encoding, its picker and pods). :mod:`e2e` replays the
chainsaw e2e tests from upstream's files. Until the public test data holds those files and seven
documentation CRs (``shared_data_wanted.json`` names each: repository, commit, path, SHA-256),
they are retyped in the places marked PENDING SHARED DATA. The objects are turned into
AdmissionReviews as the API server would hand them to a validating webhook (after the CRD schema:
unknown fields pruned, defaults filled). :mod:`corpus` collects them all.
"""
