"""Upstream-derived admission cases: NodeWright's (and the older Skyhook repository's) own webhook
unit tests, chainsaw e2e steps, samples and documentation CRs, each as the request it causes, with
its provenance (repository, commit, path, item) and upstream's verdict.

Upstream's CRs are upstream's material, not ours (issue 31): the sample and documentation CRs
(:mod:`documents`, ``shared("nodewright")``) and the chainsaw e2e tests (:mod:`e2e`,
``shared("nodewright-e2e")``) are read unedited from the public test data, each file checked
against its manifest; where the data is absent the tests that need them skip with one line (fail
under NODEGATE_REQUIRE_TEST_DATA=1). What these modules keep are facts (test and step names, what a
script does, upstream's verdicts and messages) and our own models (the API server, the operator's
Go encoding, its picker and pods). The objects are turned into AdmissionReviews as the API server
would hand them to a validating webhook (after the CRD schema: unknown fields pruned, defaults
filled). :mod:`corpus` collects them all.
"""
